"""Baselines that decode with one model only: the target (LLM) alone and the draft (SLM) alone, the
reference rows of every paper (R-Stitch Table 1 "LLM-7B" and "SLM", RSD §3 "Target model only",
SpecReason §5.1 "vanilla inference", Arbitrage §5.2's target-only and draft-only lines, EASD
Table 1 "Single Model")."""
from __future__ import annotations

from rstitch.engines import SwitchRule, TokenDistribution
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, Method, register_method
from rstitch.methods.token_switch import SwitchPolicy, switch_decode


class _Fixed(SwitchPolicy):
    def __init__(self, source: int):
        self.source = source

    def first(self) -> int:
        return self.source

    def next(self, source: int, dist: TokenDistribution) -> int:
        return self.source

    def rule(self, source: int) -> SwitchRule:
        return SwitchRule.never()  # one run to EOS or the budget: the path step-level methods' steps take


@register_method("llm_only")
class LLMOnly(Method):
    family = "token"
    baseline = "target"

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        return switch_decode(prompt_ids, ctx, _Fixed(LLM))


@register_method("slm_only")
class SLMOnly(Method):
    family = "token"
    baseline = "draft"

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        return switch_decode(prompt_ids, ctx, _Fixed(SLM))
