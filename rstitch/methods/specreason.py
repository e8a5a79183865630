"""SpecReason: the small model drafts each reasoning step, the base model judges it (SpecReason §4.1;
SpecReason+Decode, §4.2, is specreason_decode). The paper has no numbered equations: §4.1's
single-token 0-9 score in one prefill-only pass and a static threshold (e.g. score >= 7) are it.
The judge reads the draft on the base model's own sequence (§4.1), so it prefills only the draft
and the scoring prompt, then rolls the prompt back: docs/step-level.md "SpecReason".
"""
from __future__ import annotations

from typing import Any

import torch

from rstitch.engines import ModelRunner
from rstitch.errors import ConfigError
from rstitch.judge_prompt import JUDGE_INSTRUCTION, JUDGE_PREFIX, judge_prompt  # noqa: F401  (the method's prompt, re-exported)
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, register_method, require_choice, require_int, require_number
from rstitch.methods.drafts import Step, Verdict
from rstitch.methods.spec_stats import SpecStats
from rstitch.methods.specdec import SpecDec, check_vocabularies
from rstitch.methods.steps import DraftVerifyMethod, ModelSequences, StepDecoder, StepRun

SCORE_MODES = ("greedy", "expected")
JUDGE_CONTEXTS = ("reasoning", "chat")
_STEPS_MARK = "\x00steps\x00"  # stands for the reasoning when the scoring prompt is cut from the template


def judge_suffix_ids(tokenizer: Any) -> list[int]:
    """The scoring prompt after the reasoning on the base model's own sequence: what the chat template
    puts after the assistant's reasoning in `judge_prompt`'s conversation, then JUDGE_PREFIX."""
    full = judge_prompt(tokenizer, "", [_STEPS_MARK], "")
    if _STEPS_MARK not in full:
        raise ConfigError("SpecReason: the base model's chat template drops the assistant's reasoning; use method.judge_context=chat")
    return tokenizer.encode(full.split(_STEPS_MARK, 1)[1], add_special_tokens=False)


def without_trailing_space(tokenizer: Any, token_ids: list[int]) -> list[int]:
    """`token_ids` less the trailing tokens that decode to whitespace or nothing (the step's
    separator, EOS): the judge reads the step as `judge_prompt` writes it, stripped."""
    end = len(token_ids)
    while end and not tokenizer.decode(token_ids[end - 1:end], skip_special_tokens=True).strip():
        end -= 1
    return token_ids[:end]


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
    def __init__(self, threshold: float = 7.0, score_mode: str = "greedy", first_n_by_base: int = 0,
                 judge_context: str = "reasoning", **step_options: Any):
        super().__init__(**step_options)
        self.threshold = require_number("specreason", "threshold", threshold)
        self.score_mode = require_choice("specreason", "score_mode", score_mode, SCORE_MODES)
        self.judge_context = require_choice("specreason", "judge_context", judge_context, JUDGE_CONTEXTS)
        self.first_n_by_base = require_int("specreason", "first_n_by_base", first_n_by_base, low=0)

    def start(self, prompt_ids: list[int], ctx: DecodeContext) -> StepRun:
        run = super().start(prompt_ids, ctx)
        if self.judge_context == "chat":
            run.state["judge"] = ModelSequences(ctx)  # a second sequence of the base model
        else:
            run.state["suffix"] = judge_suffix_ids(ctx.pair.llm.tokenizer)
        run.state["digits"] = digit_token_ids(ctx.pair.llm)
        return run

    def base_writes(self, run: StepRun, path: StepDecoder) -> bool:
        return len(path.steps) < self.first_n_by_base

    def verify(self, run: StepRun, path: StepDecoder, draft: Step) -> Verdict:
        if self.judge_context == "chat":
            score = self.judge(run, path.step_texts + [draft.text])
        else:
            score = self.judge_in_reasoning(run, path, draft)
        return Verdict(score >= self.threshold, score)

    def judge_in_reasoning(self, run: StepRun, path: StepDecoder, draft: Step) -> float:
        """The base model's 0-9 score of `draft`, read on its own decoding sequence."""
        step = without_trailing_space(run.ctx.pair.llm.tokenizer, draft.token_ids)
        suffix = run.state["suffix"]
        with run.meter.judging():
            seq = path.models.aligned(LLM, path.prompt_ids + path.output + step)
            logits = seq.score(suffix)[-1].logits  # keeps the draft's last position: no re-run after the rollback
            seq.rollback(len(suffix))
        return digit_score(logits, run.state["digits"], self.score_mode)

    def judge(self, run: StepRun, steps: list[str]) -> float:
        """The 0-9 score of the last of `steps` in a separate conversation (`judge_context: chat`)."""
        base = run.ctx.pair.llm
        text = judge_prompt(base.tokenizer, run.ctx.problem, steps, self.step_config.separator)
        ids = base.tokenizer.encode(text, add_special_tokens=False)
        with run.meter.judging():
            logits = run.state["judge"].aligned(LLM, ids).next_distribution().logits
        return digit_score(logits, run.state["digits"], self.score_mode)


@register_method("specreason_decode")
class SpecReasonDecode(SpecReason):
    """SpecReason+Decode: the base model's steps are decoded speculatively (lossless: SpecReason's
    output under greedy decoding, in fewer base-model forwards)."""

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
        tokens, _, finish = SpecDec(self.k).extend(
            draft, target, run.ctx, path.step_limit, run.state["spec"], stop=(self.step_config.separator,))
        return path.as_step(LLM, tokens, finish)
