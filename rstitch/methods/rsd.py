"""Reward-guided speculative decoding (RSD, Algorithms 1 and 2).

The draft model (pair.slm) writes a step; the PRM scores it (r, reward of the last step given the
problem and all earlier steps); the step is accepted with probability omega(r), else the target
model (pair.llm) writes the step from the same prefix. Weighting functions (docs/step-level.md):

    constant   omega = p
    binary     omega = 1[r >= delta]                      (the paper's default, delta = 0.7)
    clipping   omega = min(1, max(0, r))                  (Table 1)
    scaled_clipping  omega = min(1, max(0, r / delta))    (ours: clipping with the ramp ending at delta)
    rational   omega = r / (1 + r)
    logistic   omega = max(0, 1 / (1 + exp(-alpha (r - delta))))   (Table 1's sigmoidal weighting)

omega in {0, 1} decides without randomness; strictly between, a uniform draw u accepts iff
u < omega (from the method's own generator, so coins never shift the sampled tokens).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from rstitch.errors import ConfigError
from rstitch.methods.base import DecodeContext, register_method, require_number
from rstitch.methods.steps import DEFAULT_PRM, DraftVerifyMethod, Step, StepDecoder, StepRun, Verdict, decision_generator


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def _scaled_clipping(r: float, delta: float) -> float:
    return 1.0 if delta <= 0 else _clip01(r / delta)


def _sigmoidal(r: float, alpha: float, delta: float) -> float:
    """max(0, sigmoid(alpha (r - delta))) as Table 1 writes it, evaluated without overflow: a
    reward far below delta (a steep alpha, or a PRM on a logit scale) gives 0, not an error."""
    z = alpha * (r - delta)
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    small = math.exp(z)  # z < 0: no overflow (exp(-z) would overflow past z = -709)
    return max(0.0, small / (1.0 + small))


WEIGHTINGS: dict[str, Callable[[float, RSD], float]] = {
    "constant": lambda r, m: m.p,
    "binary": lambda r, m: 1.0 if r >= m.delta else 0.0,
    "clipping": lambda r, m: _clip01(r),
    "scaled_clipping": lambda r, m: _scaled_clipping(r, m.delta),
    "rational": lambda r, m: r / (1.0 + r),
    "logistic": lambda r, m: _sigmoidal(r, m.alpha, m.delta),
}


@register_method("rsd")
class RSD(DraftVerifyMethod):
    delta: float  # declared for WEIGHTINGS, whose lambdas read them before __init__ is seen
    p: float
    alpha: float

    def __init__(
        self,
        delta: float = 0.7,
        weighting: str = "binary",
        p: float = 0.5,
        alpha: float = 10.0,
        seed: int = 0,
        prm: Any = None,
        **step_options: Any,
    ):
        super().__init__(**step_options)
        if weighting not in WEIGHTINGS:
            raise ConfigError(f"method.weighting of 'rsd' must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
        self.weighting = weighting
        self.delta = require_number("rsd", "delta", delta)
        self.p = require_number("rsd", "p", p, 0.0, 1.0)
        self.alpha = require_number("rsd", "alpha", alpha, low=0.0)
        self.seed = seed
        self.use_prm(DEFAULT_PRM if prm is None else prm)

    def omega(self, reward: float) -> float:
        return WEIGHTINGS[self.weighting](reward, self)

    def start(self, prompt_ids: list[int], ctx: DecodeContext) -> StepRun:
        run = super().start(prompt_ids, ctx)
        run.state["coins"] = decision_generator(self.seed, prompt_ids)
        return run

    def verify(self, run: StepRun, path: StepDecoder, draft: Step) -> Verdict:
        scores = self.scoring_prm().score(run.problem, path.step_texts + [draft.text])
        run.log.fill_target_scores(scores[:-1])  # earlier target steps' rewards come for free
        reward = scores[-1]
        return Verdict(accepts(self.omega(reward), run.state["coins"]), reward)


def accepts(omega: float, coins: torch.Generator) -> bool:
    if omega >= 1.0:
        return True
    if omega <= 0.0:
        return False
    return float(torch.rand((), generator=coins)) < omega
