"""R-Stitch: entropy-guided token-level switching between SLM and LLM (R-Stitch §3.2.2, eqs. 1-2;
Algorithm 1 in appendix A.3, the R-Stitch branch): an SLM token whose normalized entropy exceeds tau
is discarded and the LLM writes the position, keeping control until its own token's is <= tau.
"""
from __future__ import annotations

from rstitch.engines import SwitchRule, TokenDistribution
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, Method, register_method, require_number
from rstitch.methods.token_switch import SwitchPolicy, switch_decode


class EntropySwitch(SwitchPolicy):
    def __init__(self, tau: float):
        self.tau = tau

    def keep(self, source: int, dist: TokenDistribution) -> bool:
        return source == LLM or dist.normalized_entropy <= self.tau

    def next(self, source: int, dist: TokenDistribution) -> int:
        return SLM if dist.normalized_entropy <= self.tau else source

    def rule(self, source: int) -> SwitchRule:
        """The SLM runs while H <= tau and drops its first token above; the LLM runs while
        H > tau and keeps its first token at or below, then hands back."""
        if source == SLM:
            return SwitchRule(self.tau, stop_above=True, keep_last=False)
        return SwitchRule(self.tau, stop_above=False, keep_last=True)


@register_method("rstitch")
class RStitch(Method):
    family = "token"

    def __init__(self, tau: float = 0.02):
        # Any finite tau: tau < 0 sends every token to the LLM, tau >= 1 keeps the SLM throughout.
        self.tau = require_number("rstitch", "tau", tau)

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        return switch_decode(prompt_ids, ctx, EntropySwitch(self.tau))
