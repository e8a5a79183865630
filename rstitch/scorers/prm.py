"""What a process reward model (PRM) is: a score in [0, 1] for every step of a partial solution.
PRMs are causal (a prefix's scores are the first scores of all the steps): RSD reads a replacing
target step's score from a later call at no extra cost.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from rstitch.engines import CostCounter


class ProcessRewardModel(ABC):
    """Scores steps; `cost` counts the tokens it ran and the time it took (for FLOPs:
    2 x `num_parameters` x `cost.tokens_processed`)."""

    name: str
    num_parameters: int = 0

    def __init__(self) -> None:
        self.cost = CostCounter()

    @abstractmethod
    def score(self, problem: str, steps: Sequence[str]) -> list[float]:
        """One score per step, each in [0, 1]; steps are given without their separator."""
