"""What a process reward model (PRM) is: a score in [0, 1] for every step of a partial solution.

PRMs are causal: the score of step i depends only on the problem and steps 0..i, so scoring a
prefix of the steps returns the first scores of scoring all of them. Step-level methods rely on
this to read the score of an earlier step (e.g. a target step that replaced a rejected draft)
from a later call at no extra cost.
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
