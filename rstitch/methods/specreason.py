"""SpecReason: the small model drafts each reasoning step, the base model judges it.

The judge is the base model (pair.llm) itself, in one prefill of the conversation
[user: problem, assistant: steps so far joined by the separator (draft step included),
user: JUDGE_INSTRUCTION] + generation prompt + JUDGE_PREFIX. Its next-token distribution over the
digits 0-9 gives the score: the most likely digit (`score_mode: greedy`) or the
probability-weighted mean digit (`expected`). The draft is kept iff score >= threshold, else the
base model writes the step (`regenerate_step`, the hook for SpecReason+Decode). The judge runs on
its own sequence of the base model, so the decoding cache is untouched; its tokens and time are
reported apart (`judge_tokens`, `judge_time_s`, `flops_judge`).
"""
from __future__ import annotations

from typing import Any

import torch

from rstitch.engines import ModelRunner
from rstitch.errors import ConfigError
from rstitch.judge_prompt import JUDGE_INSTRUCTION, JUDGE_PREFIX, judge_prompt  # noqa: F401  (the method's prompt, re-exported)
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, register_method, require_int, require_number
from rstitch.methods.spec_stats import SpecStats
from rstitch.methods.specdec import SpeculativeDecoder, check_vocabularies
from rstitch.methods.steps import DraftVerifyMethod, ModelSequences, Step, StepDecoder, StepRun, Verdict

SCORE_MODES = ("greedy", "expected")
def digit_ids(tokenizer: Any, name: str = "the model") -> list[int]:
    """Token ids of the judge's answers "0".."9", each checked to be a single token."""
    ids = [tokenizer.encode(str(d), add_special_tokens=False) for d in range(10)]
    if any(len(i) != 1 for i in ids):
        raise ConfigError(f"SpecReason needs single-token digits; the tokenizer of '{name}' splits some")
    return [i[0] for i in ids]


def digit_token_ids(runner: ModelRunner) -> list[int]:
    return digit_ids(runner.tokenizer, runner.name)


def digit_score(logits: torch.Tensor, digit_ids: list[int], mode: str) -> float:
    digit_logits = logits[digit_ids]
    if mode == "greedy":
        return float(digit_logits.argmax())
    probs = torch.softmax(digit_logits.float(), dim=-1)  # renormalized over the ten digits
    return float((probs * torch.arange(10, dtype=probs.dtype, device=probs.device)).sum())


@register_method("specreason")
class SpecReason(DraftVerifyMethod):
    def __init__(self, threshold: float = 7.0, score_mode: str = "greedy", first_n_by_base: int = 0, **step_options: Any):
        super().__init__(**step_options)
        self.threshold = require_number("specreason", "threshold", threshold)
        if score_mode not in SCORE_MODES:
            raise ConfigError(f"method.score_mode of 'specreason' must be one of {', '.join(SCORE_MODES)}, got {score_mode!r}")
        self.score_mode = score_mode
        self.first_n_by_base = require_int("specreason", "first_n_by_base", first_n_by_base, low=0)

    def start(self, prompt_ids: list[int], ctx: DecodeContext) -> StepRun:
        run = super().start(prompt_ids, ctx)
        run.state["judge"] = ModelSequences(ctx)  # the judge's own sequence of the base model
        run.state["digits"] = digit_token_ids(ctx.pair.llm)
        return run

    def base_writes(self, run: StepRun, path: StepDecoder) -> bool:
        return len(path.steps) < self.first_n_by_base

    def verify(self, run: StepRun, path: StepDecoder, draft: Step) -> Verdict:
        score = self.judge(run, path.step_texts + [draft.text])
        return Verdict(score >= self.threshold, score)

    def judge(self, run: StepRun, steps: list[str]) -> float:
        """The base model's 0-9 score of the last of `steps`."""
        base = run.ctx.pair.llm
        text = judge_prompt(base.tokenizer, run.problem, steps, run.config.separator)
        ids = base.tokenizer.encode(text, add_special_tokens=False)
        with run.meter.judging():
            logits = run.state["judge"].aligned(LLM, ids).next_distribution().logits
        return digit_score(logits, run.state["digits"], self.score_mode)


@register_method("specreason_decode")
class SpecReasonDecode(SpecReason):
    """SpecReason+Decode: the base model's steps are decoded with speculative decoding (the small
    model drafting k tokens at a time), which is lossless, so the output equals SpecReason's under
    greedy decoding while the base model runs fewer forwards."""

    def __init__(self, k: int = 5, **specreason_options: Any):
        super().__init__(**specreason_options)
        self.k = require_int("specreason_decode", "k", k)

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        check_vocabularies(ctx)
        run = self.start(prompt_ids, ctx)
        run.state["spec"] = SpecStats(self.k)
        finish = run.path.complete(lambda path: self.next_step(run, path))
        return run.result(run.path, finish, **{f"spec_{k}": v for k, v in run.state["spec"].as_dict().items()})

    def regenerate_step(self, run: StepRun, path: StepDecoder) -> Step:
        context = path.prompt_ids + path.output
        draft, target = path.models.aligned(SLM, context), path.models.aligned(LLM, context)
        tokens, _, finish = SpeculativeDecoder(self.k).extend(
            draft, target, run.ctx, path.step_limit, run.state["spec"], stop=(run.config.separator,))
        return path.as_step(LLM, tokens, finish)
