"""The loop shared by step-level methods (RSD, SpecReason, Arbitrage, PRM search baselines): the
papers' steps (RSD §3, a generation ended with "\\n\\n"; Arbitrage §3.1, a separator token;
SpecReason §4.1, semantically self-contained units). Steps are token-exact, so a loop that accepts
every step of one model is that model's plain decoding (docs/step-level.md "Steps"). FLOPs =
2 x parameters x processed tokens over draft, target, judge, PRM and router (RSD section 3.3).
"""
from __future__ import annotations

import statistics
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rstitch.engines import CostCounter, ModelPair, Sampler
from rstitch.errors import ConfigError
from rstitch.methods.base import EXTRA_FLOPS, LLM, SLM, DecodeContext, DecodeResult, Method, model_flops, require_int
from rstitch.methods.drafts import Step, Verdict
from rstitch.methods.token_switch import ModelSequences
from rstitch.scorers import ProcessRewardModel, check_prm_spec, resolve_prm

DEFAULT_PRM = {"name": "testbed"}


@dataclass(frozen=True)
class StepConfig:
    separator: str = "\n\n"
    max_step_tokens: int = 1024  # a step longer than this is cut (the sample goes on)
    max_steps: int = 512  # the sample ends after this many steps ("step_cap")
    max_repeats: int = 5  # ...or after this many identical steps in a row ("repeat"); 0 = never


def step_text(text: str, separator: str) -> str:
    head, found, tail = text.partition(separator)
    return (head + tail).strip() if found else text.strip()


class StepDecoder:
    """One solution path of one sample: the committed steps and the models that extend it."""

    def __init__(self, prompt_ids: list[int], ctx: DecodeContext, config: StepConfig,
                 models: ModelSequences | None = None, calls: Counter | None = None):
        self.prompt_ids, self.ctx, self.config = list(prompt_ids), ctx, config
        self.models = models or ModelSequences(ctx)
        self.calls = calls if calls is not None else Counter()  # shared by the paths of a sample
        self.output: list[int] = []
        self.sources: list[int] = []
        self.steps: list[Step] = []

    @property
    def budget_left(self) -> int:
        return self.ctx.max_new_tokens - len(self.output)

    @property
    def step_texts(self) -> list[str]:
        return [s.text for s in self.steps]

    @property
    def step_limit(self) -> int:
        """The most tokens the next step may have."""
        return min(self.config.max_step_tokens, self.budget_left)

    def generate(self, source: int, sampler: Sampler | None = None) -> Step:
        """`source`'s next step from the committed prefix (not committed)."""
        seq = self.models.aligned(source, self.prompt_ids + self.output)
        gen = seq.generate(self.step_limit, sampler or self.ctx.sampler, stop=[self.config.separator], eos_ids=self.ctx.eos_ids)
        return self.as_step(source, gen.token_ids, gen.finish_reason)

    def as_step(self, source: int, token_ids: list[int], generation_finish: str) -> Step:
        """The step of tokens `source` generated as `generate` would (stop at the separator, at
        most `step_limit` tokens; the engine's "stop" | "eos" | "length"), counted in `calls`."""
        finish = {"stop": "separator", "eos": "eos"}.get(generation_finish)
        if finish is None:
            finish = "budget" if len(token_ids) >= self.budget_left else "step_cap"
        self.calls[f"steps_{source}"] += 1
        self.calls[f"tokens_{source}"] += len(token_ids)
        self.calls["capped_steps"] += finish == "step_cap"  # cut by max_step_tokens (ours, not the papers')
        text = self.ctx.runner(source).tokenizer.decode(token_ids, skip_special_tokens=True)
        return Step(list(token_ids), step_text(text, self.config.separator), source, finish)

    def commit(self, step: Step) -> None:
        self.output.extend(step.token_ids)
        self.sources.extend([step.source] * len(step.token_ids))
        self.steps.append(step)

    def finish_reason(self) -> str | None:
        """Why this path is done, or None while it goes on."""
        if self.steps and self.steps[-1].finish == "eos":
            return "eos"
        if self.budget_left <= 0:
            return "length"
        if len(self.steps) >= self.config.max_steps:
            return "step_cap"
        n = self.config.max_repeats
        if n and len(self.steps) >= n and all(s.token_ids == self.steps[-1].token_ids for s in self.steps[-n:]):
            return "repeat"
        return None

    def fork(self, models: ModelSequences) -> StepDecoder:
        """A copy of this path that extends with other sequences (beam search)."""
        twin = StepDecoder(self.prompt_ids, self.ctx, self.config, models, self.calls)
        twin.output, twin.sources, twin.steps = list(self.output), list(self.sources), list(self.steps)
        return twin

    def complete(self, next_step: Callable[[StepDecoder], Step]) -> str:
        """Commit `next_step(self)` until the path is done; returns the finish reason."""
        while (finish := self.finish_reason()) is None:
            self.commit(next_step(self))
        return finish


@dataclass
class StepRecord:
    source: int  # the model whose step was kept
    decision: str  # "accept" | "escalate" | "base" | "select"
    draft_score: float | None = None  # what the decision read about the draft (reward, judge score, y_hat)
    target_score: float | None = None  # the target step's PRM score, when it was scored


@dataclass
class StepLog:
    records: list[StepRecord] = field(default_factory=list)

    def add(self, source: int, decision: str, draft_score: float | None = None, target_score: float | None = None) -> None:
        self.records.append(StepRecord(source, decision, draft_score, target_score))

    def fill_target_scores(self, kept_scores: list[float]) -> None:
        """Scores of the kept steps from a later (causal) PRM call: escalated steps get theirs."""
        for record, score in zip(self.records, kept_scores):
            if record.decision == "escalate" and record.target_score is None:
                record.target_score = score

    def stats(self) -> dict[str, Any]:
        decisions = [r.decision for r in self.records]
        drafted = decisions.count("accept") + decisions.count("escalate")
        scored = [(r.draft_score, r.target_score) for r in self.records
                  if r.decision == "escalate" and r.draft_score is not None and r.target_score is not None]
        return {
            "steps": len(self.records),
            "drafted_steps": drafted,
            "accepted_steps": decisions.count("accept"),
            "escalations": decisions.count("escalate"),
            "acceptance_rate": decisions.count("accept") / drafted if drafted else None,
            "escalations_scored": len(scored),
            "wasted_escalations": sum(1 for draft, target in scored if target <= draft),
            "step_sources": [r.source for r in self.records],
            "step_decisions": decisions,
            "step_scores": [r.draft_score for r in self.records],
            "step_target_scores": [r.target_score for r in self.records],
        }


class CostMeter:
    """Costs of one sample since it started, per component; FLOPs = 2 x params x tokens."""

    def __init__(self, pair: ModelPair, prm: ProcessRewardModel | None = None, router: Any = None):
        self.components = {"draft": pair.slm, "target": pair.llm, "prm": prm, "router": router}
        self.components = {k: v for k, v in self.components.items() if v is not None}
        self.before = {k: c.cost.copy() for k, c in self.components.items()}
        self.judge = CostCounter()  # judge forwards run on the target model: also in its counter

    @contextmanager
    def judging(self) -> Iterator[None]:
        target = self.components["target"].cost
        before = target.copy()
        yield
        spent = target.since(before)
        for key, value in spent.as_dict().items():
            setattr(self.judge, key, getattr(self.judge, key) + value)

    def stats(self) -> dict[str, Any]:
        spent = {k: c.cost.since(self.before[k]) for k, c in self.components.items()}
        tokens = {k: s.tokens_processed for k, s in spent.items()}
        params = {k: c.num_parameters for k, c in self.components.items()}
        tokens["target"] -= self.judge.tokens_processed
        tokens["judge"], params["judge"] = self.judge.tokens_processed, params["target"]
        flops = {k: model_flops(params[k], tokens[k]) for k in tokens}
        out: dict[str, Any] = {"flops": sum(flops.values())}
        out.update({f"flops_{k}": v for k, v in flops.items()})
        out[EXTRA_FLOPS] = sum(flops.get(k, 0.0) for k in ("prm", "router"))  # outside the pair: the runner adds it
        if self.judge.forward_calls:
            spent["judge"] = self.judge
        for key in ("prm", "router", "judge"):
            if key in spent:
                out.update({f"{key}_tokens": tokens[key], f"{key}_calls": spent[key].forward_calls,
                            f"{key}_time_s": spent[key].forward_time_s})
        return out


@dataclass
class StepRun:
    """Everything one sample of a step-level method works with."""

    ctx: DecodeContext
    log: StepLog
    meter: CostMeter
    path: StepDecoder  # the sample's main solution path: its sequences and call counts are the sample's
    state: dict[str, Any] = field(default_factory=dict)  # a method's own per-sample state

    def result(self, path: StepDecoder, finish: str, **extra: Any) -> DecodeResult:
        calls = path.calls
        generated = calls[f"tokens_{SLM}"] + calls[f"tokens_{LLM}"]
        stats = {
            **self.log.stats(),
            "draft_calls": calls[f"steps_{SLM}"],
            "target_calls": calls[f"steps_{LLM}"],
            "generated_tokens": generated,
            "capped_steps": calls["capped_steps"],
            **self.meter.stats(),
            **extra,
        }
        switches = sum(1 for a, b in zip(path.steps, path.steps[1:]) if a.source != b.source)
        return DecodeResult(path.output, path.sources, finish, generated - len(path.output), switches, stats)


class StepMethod(Method):
    """Base of step-level methods: step options, optional PRM / router, the decode loop."""

    family = "step"

    def __init__(self, separator: str = "\n\n", max_step_tokens: int = 1024, max_steps: int = 512, max_repeats: int = 5):
        if not isinstance(separator, str) or not separator:
            raise ConfigError(f"method.separator of '{self.name}' must be a non-empty string, got {separator!r}")
        self.step_config = StepConfig(separator, require_int(self.name, "max_step_tokens", max_step_tokens),
                                      require_int(self.name, "max_steps", max_steps),
                                      require_int(self.name, "max_repeats", max_repeats, low=0))
        self._prm_spec: ProcessRewardModel | dict | None = None

    def use_prm(self, spec: Any) -> None:
        self._prm_spec = check_prm_spec(spec, self.name)

    @property
    def prm(self) -> ProcessRewardModel | None:
        """Loaded at first use, so building a method (and validating its config) stays cheap."""
        if self._prm_spec is None:
            return None
        return resolve_prm(self._prm_spec)

    def last_step_score(self, run: StepRun, path: StepDecoder, step: Step) -> float:
        """The PRM's reward of `step` appended to `path`."""
        return self.scoring_prm().score(run.ctx.problem, path.step_texts + [step.text])[-1]

    def scoring_prm(self) -> ProcessRewardModel:
        """The PRM of a method that scores steps (it configures one with `use_prm` when built)."""
        prm = self.prm
        assert prm is not None, f"method '{self.name}' scores steps, so it configures a PRM when built"
        return prm

    def router(self) -> Any:
        """A learned router whose costs count in this method's FLOPs (none by default)."""
        return None

    def start(self, prompt_ids: list[int], ctx: DecodeContext) -> StepRun:
        path = StepDecoder(prompt_ids, ctx, self.step_config)
        return StepRun(ctx, StepLog(), CostMeter(ctx.pair, self.prm, self.router()), path)

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        """One path, extended by `next_step` until it ends (search methods override this)."""
        run = self.start(prompt_ids, ctx)
        finish = run.path.complete(lambda path: self.next_step(run, path))
        return run.result(run.path, finish)

    @abstractmethod
    def next_step(self, run: StepRun, path: StepDecoder) -> Step:
        """The step to commit next on `path` (its decision logged in `run.log`)."""

    def summarize(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return summarize_step_stats(samples)


class DraftVerifyMethod(StepMethod):
    """The SLM drafts a step; `verify` accepts it or the LLM rewrites it (RSD, SpecReason, Arbitrage)."""

    @abstractmethod
    def verify(self, run: StepRun, path: StepDecoder, draft: Step) -> Verdict:
        """Accept the draft step written after `path`'s committed steps, or not."""

    def base_writes(self, run: StepRun, path: StepDecoder) -> bool:
        """True when the target model writes this step without a draft."""
        return False

    def regenerate_step(self, run: StepRun, path: StepDecoder) -> Step:
        """The LLM's step after `path` (uncommitted; SpecReason+Decode decodes it speculatively)."""
        return path.generate(LLM)

    def next_step(self, run: StepRun, path: StepDecoder) -> Step:
        if self.base_writes(run, path):
            run.log.add(LLM, "base")
            return self.regenerate_step(run, path)
        draft = path.generate(SLM)
        verdict = self.verify(run, path, draft)
        if verdict.accept:
            run.log.add(SLM, "accept", verdict.score)
            return draft
        run.log.add(LLM, "escalate", verdict.score)
        return self.regenerate_step(run, path)


_MEAN_KEYS = (  # "flops" itself is the common summary's (the mean of the samples' totals)
    "steps", "draft_calls", "target_calls", "generated_tokens", "flops_draft", "flops_target",
    "flops_judge", "flops_prm", "flops_router", "prm_tokens", "prm_time_s", "judge_tokens", "judge_time_s",
    "router_tokens", "router_time_s",
)


def summarize_step_stats(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Run-level step metrics: means per sample, and rates pooled over all steps."""
    stats = [s.get("stats") or {} for s in samples]
    if not stats:
        return {}
    out: dict[str, Any] = {}
    for key in _MEAN_KEYS:
        values = [s[key] for s in stats if s.get(key) is not None]
        if values:
            out[key] = statistics.fmean(values)
    total = lambda key: sum(s.get(key) or 0 for s in stats)  # noqa: E731
    drafted, scored = total("drafted_steps"), total("escalations_scored")
    out["acceptance_rate"] = total("accepted_steps") / drafted if drafted else None
    out["escalation_rate"] = total("escalations") / drafted if drafted else None
    out["wasted_escalation_rate"] = total("wasted_escalations") / scored if scored else None
    # How often the step caps (ours, not the papers') fired: each changes latency when it does.
    finishes = Counter(s.get("finish_reason") for s in samples)
    out["step_caps_max_step_tokens"] = total("capped_steps")
    out["step_caps_max_steps"], out["step_caps_max_repeats"] = finishes["step_cap"], finishes["repeat"]
    return out
