"""R-Stitch's random-routing baseline (R-Stitch §4, "Latency-accuracy trade-off", Figure 4): each
token goes to the SLM with probability p (the paper's p in {0.1, 0.3, 0.5, 0.7, 0.9})."""
from __future__ import annotations

import torch

from rstitch.engines import TokenDistribution
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, Method, register_method, require_int, require_number
from rstitch.methods.token_switch import SwitchPolicy, switch_decode


class _Coin(SwitchPolicy):
    def __init__(self, p_slm: float, generator: torch.Generator):
        self.p_slm, self.generator = p_slm, generator

    def _draw(self) -> int:
        return SLM if float(torch.rand((), generator=self.generator)) < self.p_slm else LLM

    def first(self) -> int:
        return self._draw()

    def next(self, source: int, dist: TokenDistribution) -> int:
        return self._draw()


@register_method("random")
class RandomRouting(Method):
    family = "token"

    def __init__(self, p: float = 0.5, seed: int = 0):
        self.p = require_number("random", "p", p, 0.0, 1.0)
        self.seed = require_int("random", "seed", seed, low=0)

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        # Its own generator: routing coins must not shift the sampler's token stream.
        generator = torch.Generator().manual_seed(self.seed + len(prompt_ids) * 7919 + sum(prompt_ids))
        return switch_decode(prompt_ids, ctx, _Coin(self.p, generator))
