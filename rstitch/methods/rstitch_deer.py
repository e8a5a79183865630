"""R-Stitch with DEER's dynamic early exit (R-Stitch appendix A.7, Table 3; docs/rstitch-deer.md).

R-Stitch states the combination ("Our integration retains DEER's stopping criterion but substitutes
its single-model decoding with R-Stitch") but none of DEER's values: those are DEER's code's.
`switch_decode` has no hook to stop at a transition, so this method drives its one-position step
(`switch_step`) itself: with no transition that is one call of the loop exactly (the same
forwards, the same draws).
"""
from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from typing import Any

from rstitch.engines.base import StopWatcher
from rstitch.errors import ConfigError
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, Method, register_method, require_choice, require_int, require_number
from rstitch.methods.rstitch import EntropySwitch
from rstitch.methods.token_switch import ModelSequences, SwitchPolicy, SwitchState, switch_decode, switch_step

NAME = "rstitch_deer"
CONFIDENCES = ("mean", "min", "geometric")  # DEER's --policy avg1, min, avg2
TRIAL_MODELS = {"llm": LLM, "slm": SLM, "active": None}
ON_EXIT = ("answer", "trial")


def _text(key: str, value: Any, empty_ok: bool) -> str:
    if not isinstance(value, str) or (not value and not empty_ok):
        raise ConfigError(f"method.{key} of '{NAME}' must be a {'' if empty_ok else 'non-empty '}string, got {value!r}")
    return value


def confidence(max_probs: Seq[float], rule: str) -> float:
    """DEER's answer confidence from the trial tokens' maximum probabilities. The first trial
    token is left out (after DEER's prompt, which ends in `\\boxed`, it is the opening brace),
    as DEER's code does; a trial with nothing after it has confidence 0 (never exits)."""
    probs = list(max_probs)[1:]
    if not probs:
        return 0.0
    if rule == "min":
        return min(probs)
    if rule == "geometric":
        return math.exp(sum(math.log(max(p, 1e-10)) for p in probs) / len(probs))
    return sum(probs) / len(probs)


def closes_box(text: str) -> bool:
    """Whether the trial text (what follows the answer prompt) has closed the brace it opened:
    the end of `\\boxed{...}`, nested braces included (DEER stops its trial at such an end)."""
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth <= 0:
                return True
    return False


@register_method(NAME)
class RStitchDeer(Method):
    family = "token"

    def __init__(self, tau: float = 0.02, early_exit: bool = True, exit_threshold: float = 0.95,
                 confidence: str = "mean", trial_model: str = "llm", transitions: Seq[str] = ("Wait",),
                 answer_prompt: str = "\n**Final Answer**\n\\boxed", trial_max_tokens: int = 20,
                 max_trials: int = 10, on_exit: str = "answer", exit_text: str = "\n</think>\n\n",
                 think_end: str | None = "</think>", think_ratio: float = 0.9):
        self.tau = require_number(NAME, "tau", tau)
        if not isinstance(early_exit, bool):
            raise ConfigError(f"method.early_exit of '{NAME}' must be true or false, got {early_exit!r}")
        self.early_exit = early_exit
        # Confidences lie in [0, 1] and the exit needs confidence > threshold: 1 runs trials that never exit.
        self.exit_threshold = require_number(NAME, "exit_threshold", exit_threshold, 0.0, 1.0)
        self.confidence = require_choice(NAME, "confidence", confidence, CONFIDENCES)
        self.trial_model = require_choice(NAME, "trial_model", trial_model, TRIAL_MODELS)
        if isinstance(transitions, str) or not isinstance(transitions, Seq) or not transitions:
            raise ConfigError(f"method.transitions of '{NAME}' must be a non-empty list of strings, got {transitions!r}")
        self.transitions = [_text("transitions", t, empty_ok=False) for t in transitions]
        self.answer_prompt = _text("answer_prompt", answer_prompt, empty_ok=False)
        self.trial_max_tokens = require_int(NAME, "trial_max_tokens", trial_max_tokens, low=2)
        self.max_trials = require_int(NAME, "max_trials", max_trials, low=1)
        self.on_exit = require_choice(NAME, "on_exit", on_exit, ON_EXIT)
        self.exit_text = _text("exit_text", exit_text, empty_ok=True)
        self.think_end = None if think_end is None else _text("think_end", think_end, empty_ok=False)
        self.think_ratio = require_number(NAME, "think_ratio", think_ratio, 0.0, 1.0)
        if self.think_ratio == 0.0:
            raise ConfigError(f"method.think_ratio of '{NAME}' must be in (0, 1], got {think_ratio!r}")

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        policy = EntropySwitch(self.tau)
        if not self.early_exit:
            return switch_decode(prompt_ids, ctx, policy)
        return _DeerDecoder(self, prompt_ids, ctx, policy).run()

    def summarize(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        stats = [s["stats"] for s in samples if "deer_trials" in s.get("stats", {})]
        if not stats:
            return {}
        n = len(stats)
        return {
            "deer_exit_rate": sum(s["deer_exit"] is not None for s in stats) / n,
            "deer_confidence_exit_rate": sum(s["deer_exit"] == "confidence" for s in stats) / n,
            "deer_trials": sum(s["deer_trials"] for s in stats) / n,
            "deer_trial_tokens": sum(s["deer_trial_tokens"] for s in stats) / n,
        }


class _DeerDecoder:
    """One sample: the stepped R-Stitch loop, the trials at transitions and the exit."""

    def __init__(self, method: RStitchDeer, prompt_ids: list[int], ctx: DecodeContext, policy: SwitchPolicy):
        self.m, self.ctx, self.policy = method, ctx, policy
        self.tokenizer = ctx.pair.tokenizer
        self.eos = ctx.eos_ids
        self.models = ModelSequences(ctx, prompt_ids, policy.want_hidden)
        self.state = SwitchState(policy.first())  # the output, its sources and the model writing next
        self.answer_ids = self._encode(method.answer_prompt)
        self.stats: dict[str, Any] = {"deer_trials": 0, "deer_trial_tokens": 0, "deer_confidences": [],
                                      "deer_exit": None, "deer_exit_position": None, "deer_forced_tokens": 0}

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def run(self) -> DecodeResult:
        budget = self.ctx.max_new_tokens
        think_limit = int(budget * self.m.think_ratio)
        transitions = StopWatcher(self.tokenizer, self.m.transitions)
        think_end = StopWatcher(self.tokenizer, [self.m.think_end] if self.m.think_end else [])
        thinking, finish = True, "length"
        while len(self.state.output) < budget:
            if thinking and len(self.state.output) >= think_limit:
                # DEER's thinking budget: force the answer at think_ratio x the token budget.
                if self._exit(len(self.state.output), "think_limit", trial=None):
                    finish = "early_exit"
                    break
                thinking = False
                continue
            switch_step(self.models, self.ctx, self.policy, self.state)  # one position of R-Stitch
            token = self.state.output[-1]
            if token in self.eos:
                finish = "eos"
                break
            if not thinking:
                continue
            if think_end.hit(token):
                thinking = False  # the model closed its reasoning itself: no more trials
            elif transitions.hit(token) and self.stats["deer_trials"] < self.m.max_trials:
                cut = self._transition_start()
                trial, conf = self._trial(cut)
                if conf > self.m.exit_threshold:
                    if self._exit(cut, "confidence", trial):
                        finish = "early_exit"
                        break
                    thinking = False
                # Fresh watcher: the transition just judged (and kept, if no exit) is not found again.
                transitions = StopWatcher(self.tokenizer, self.m.transitions)
        state = self.state
        return DecodeResult(state.output, state.sources, finish, state.discarded, state.switches, self.stats)

    def _transition_start(self) -> int:
        """Output index of the token where the transition string just completed begins: the
        trial sees the reasoning before it, as DEER's generation stops before "Wait"."""
        out = self.state.output
        for start in range(len(out) - 1, -1, -1):
            tail = self.tokenizer.decode(out[start:])
            if any(t in tail for t in self.m.transitions):
                return start
        return len(out) - 1

    def _active_at(self, cut: int) -> int:
        """The model that wrote output position `cut` (or writes it next)."""
        return self.state.sources[cut] if cut < len(self.state.sources) else self.state.source

    def _trial_source(self, cut: int) -> int:
        chosen = TRIAL_MODELS[self.m.trial_model]
        return self._active_at(cut) if chosen is None else chosen

    def _trial(self, cut: int) -> tuple[list[int], float]:
        """Greedy trial answer after `answer_prompt` at output position `cut`, rolled back. Greedy: no
        sampler draw, so the token stream of the reasoning is the one plain R-Stitch samples."""
        source = self._trial_source(cut)
        self.models.truncate(cut, source)
        seq = self.models.synced(source, self.state.output[:cut])
        seq.append(self.answer_ids)
        tokens: list[int] = []
        max_probs: list[float] = []
        while len(tokens) < self.m.trial_max_tokens:
            dist = seq.next_distribution()
            token = dist.argmax
            tokens.append(token)
            max_probs.append(float(dist.probs[token]))
            seq.append(token)
            if token in self.eos or closes_box(self.tokenizer.decode(tokens)):
                break
        seq.rollback(len(self.answer_ids) + len(tokens))
        conf = confidence(max_probs, self.m.confidence)
        self.stats["deer_trials"] += 1
        self.stats["deer_trial_tokens"] += len(tokens)
        self.stats["deer_confidences"].append(round(conf, 6))
        return tokens, conf

    def _exit(self, cut: int, reason: str, trial: list[int] | None) -> bool:
        """Stop the reasoning at output position `cut`; True when the kept trial answer ends the sample,
        False when the exit text is appended and R-Stitch decodes the answer."""
        self.stats["deer_exit"], self.stats["deer_exit_position"] = reason, cut
        writer = self._trial_source(cut)
        resume = self._active_at(cut)
        del self.state.output[cut:]
        del self.state.sources[cut:]
        self.models.truncate(cut, SLM, LLM)
        if self.m.on_exit == "trial":
            if trial is None:
                trial, _ = self._trial(cut)
            self._force(self.answer_ids + trial, writer)
            return True
        self._force(self._encode(self.m.exit_text), resume)
        self.state.source = resume  # the model active at the cut writes on after the exit text
        return False

    def _force(self, ids: list[int], source: int) -> None:
        """Append text no model sampled (answer prompt, exit text), cut to the budget; it counts
        as written by `source`, whose sequence processes it like any other catch-up."""
        ids = ids[: self.ctx.max_new_tokens - len(self.state.output)]
        self.state.output.extend(ids)
        self.state.sources.extend([source] * len(ids))
        self.stats["deer_forced_tokens"] += len(ids)
