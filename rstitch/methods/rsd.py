"""Reward-guided speculative decoding (RSD; Liao et al. 2025, §2.1 Algorithms 1 and 2, Table 1, eq. 2):
each draft step is accepted with probability omega(r) of its PRM reward r, else the target writes
the step, so steps follow eq. 2's mixture P_RSD = omega_r P_m + nu P_M (docs/step-level.md "RSD").
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from rstitch.methods.base import DecodeContext, register_method, require_choice, require_number
from rstitch.methods.drafts import Step, Verdict
from rstitch.methods.steps import DEFAULT_PRM, DraftVerifyMethod, StepDecoder, StepRun


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


WEIGHTINGS: dict[str, Callable[[float, RSD], float]] = {  # Table 1's rows
    "constant": lambda r, m: m.p,
    "binary": lambda r, m: 1.0 if r >= m.delta else 0.0,  # the paper's choice (§3: delta = 0.7)
    "clipping": lambda r, m: _clip01(r),
    "scaled_clipping": lambda r, m: 1.0 if m.delta <= 0 else _clip01(r / m.delta),  # ours, not in Table 1: the ramp ends at delta
    # max(0, r / (1 + r)): for r <= -1 the fraction is undefined or above 1, which Algorithm 2 (omega
    # maps into [0, 1]) and Proposition 2.2 (omega non-decreasing in r) rule out: 0 there, as for every r <= 0.
    "sigmoidal": lambda r, m: r / (1.0 + r) if r > 0 else 0.0,
    # 1 / (1 + exp(-alpha (r - delta))) without overflow: a reward far below delta (a steep alpha, or a
    # PRM on a logit scale) gives 0, not an error.
    "logistic": lambda r, m: float(torch.sigmoid(torch.tensor(m.alpha * (r - m.delta), dtype=torch.float64))),
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
        self.weighting = require_choice("rsd", "weighting", weighting, WEIGHTINGS)
        self.delta = require_number("rsd", "delta", delta)
        self.p = require_number("rsd", "p", p, 0.0, 1.0)
        self.alpha = require_number("rsd", "alpha", alpha, low=0.0)
        self.seed = seed
        self.use_prm(DEFAULT_PRM if prm is None else prm)

    def omega(self, reward: float) -> float:
        return WEIGHTINGS[self.weighting](reward, self)

    def start(self, prompt_ids: list[int], ctx: DecodeContext) -> StepRun:
        run = super().start(prompt_ids, ctx)
        # The accept/reject coins' own generator, apart from the sampler's so coins do not shift tokens.
        digest = hashlib.sha256(f"{self.seed}/{prompt_ids}".encode()).digest()
        run.state["coins"] = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        return run

    def verify(self, run: StepRun, path: StepDecoder, draft: Step) -> Verdict:
        scores = self.scoring_prm().score(run.ctx.problem, path.step_texts + [draft.text])
        run.log.fill_target_scores(scores[:-1])  # earlier target steps' rewards come for free
        reward = scores[-1]
        return Verdict(accepts(self.omega(reward), run.state["coins"]), reward)


def accepts(omega: float, coins: torch.Generator) -> bool:
    """Algorithm 2's 1(omega >= u) as u < omega (equal but for u == omega, probability 0); omega in
    {0, 1} decides without a draw. `coins` are the method's own, so they never shift sampled tokens."""
    if omega >= 1.0:
        return True
    if omega <= 0.0:
        return False
    return float(torch.rand((), generator=coins)) < omega
