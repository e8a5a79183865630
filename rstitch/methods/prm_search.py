"""Sampling-and-selection baselines of the RSD paper (RSD §3 "Baselines", Tables 2-3; EASD §4.1 and
Table 1 use maj and beam search), all with one model (`model: llm|slm`; docs/step-level.md).
Candidates sample at temperature 0.7, top_p 0.8 by default (RSD §3 "Default Setting", EASD §4.1).
Unchosen candidates count as discarded tokens, and all forwards go into FLOPs.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.grading import extract_answer, normalize_answer
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, register_method, require_choice, require_int, require_number
from rstitch.methods.steps import (
    DEFAULT_PRM,
    ModelSequences,
    Step,
    StepDecoder,
    StepMethod,
    StepRun,
)

MODEL_SOURCES = {"slm": SLM, "llm": LLM}


class _SampledCandidates(StepMethod):
    """Shared options: N candidates from one model at a sampling temperature."""

    needs_prm = True

    def __init__(self, n: int = 8, model: str = "llm", temperature: float | None = 0.7, top_p: float | None = 0.8,
                 prm: Any = None, **step_options: Any):
        super().__init__(**step_options)
        self.n = require_int(self.name, "n", n)
        self.source = MODEL_SOURCES[require_choice(self.name, "model", model, MODEL_SOURCES)]
        self.temperature = None if temperature is None else require_number(self.name, "temperature", temperature, low=0.0)
        self.top_p = None if top_p is None else require_number(self.name, "top_p", top_p, 0.0, 1.0)
        if self.needs_prm:
            self.use_prm(DEFAULT_PRM if prm is None else prm)
        elif prm is not None:
            raise ConfigError(f"method '{self.name}' uses no PRM, got method.prm={prm!r}")

    def sample_step(self, run: StepRun, path: StepDecoder) -> Step:
        """`source`'s step at the method's temperature / top_p (None: the run's), drawn from the run's
        (per-sample) generator."""
        sampler = run.ctx.sampler
        if self.temperature is not None or self.top_p is not None:
            sampler = Sampler(temperature=sampler.temperature if self.temperature is None else self.temperature,
                              top_p=sampler.top_p if self.top_p is None else self.top_p)
            sampler.generator = run.ctx.sampler.generator
        return path.generate(self.source, sampler)

    def next_step(self, run: StepRun, path: StepDecoder) -> Step:
        return self.sample_step(run, path)  # full solutions take every sampled step

    def full_solutions(self, run: StepRun) -> list[tuple[StepDecoder, str]]:
        """N complete solutions, one after the other on the sample's sequences."""
        solutions = []
        for _ in range(self.n):
            path = StepDecoder(run.path.prompt_ids, run.ctx, self.step_config, run.path.models, run.path.calls)
            solutions.append((path, path.complete(lambda p: self.next_step(run, p))))
        return solutions

    def log_path(self, run: StepRun, path: StepDecoder, score: float | None = None) -> None:
        """Log the chosen path's steps; `score`, the PRM's on its last step, goes on the last."""
        for i, step in enumerate(path.steps, 1):
            run.log.add(step.source, "select", score if i == len(path.steps) else None)


@register_method("maj")
class MajorityVote(_SampledCandidates):
    needs_prm = False

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        run = self.start(prompt_ids, ctx)
        solutions = self.full_solutions(run)
        texts = [ctx.pair.tokenizer.decode(path.output, skip_special_tokens=True) for path, _ in solutions]
        extracted = [extract_answer(text, multiple_choice=bool(ctx.metadata.get("multiple_choice"))) for text in texts]
        answers = [None if a is None else normalize_answer(a) for a in extracted]
        votes = Counter(a for a in answers if a is not None)
        winner = votes.most_common(1)[0][0] if votes else None
        index = answers.index(winner) if winner is not None else 0
        path, finish = solutions[index]
        self.log_path(run, path)
        return run.result(path, finish, candidate_answers=answers, votes=votes[winner] if winner is not None else 0)


@register_method("best_of_n")
class BestOfN(_SampledCandidates):
    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        run = self.start(prompt_ids, ctx)
        solutions = self.full_solutions(run)
        scores = [self.scoring_prm().score(run.ctx.problem, path.step_texts)[-1] for path, _ in solutions]
        index = max(range(len(scores)), key=scores.__getitem__)
        path, finish = solutions[index]
        self.log_path(run, path, scores[index])
        return run.result(path, finish, candidate_scores=scores)


@register_method("process_bon")
class ProcessBestOfN(_SampledCandidates):
    def next_step(self, run: StepRun, path: StepDecoder) -> Step:
        candidates = [self.sample_step(run, path) for _ in range(self.n)]
        scores = [self.last_step_score(run, path, c) for c in candidates]
        best = max(range(len(scores)), key=scores.__getitem__)
        run.log.add(self.source, "select", scores[best])
        return candidates[best]


@register_method("beam_search")
class BeamSearch(_SampledCandidates):
    def __init__(self, beam_size: int = 4, expansions: int = 4, **options: Any):
        super().__init__(n=1, **options)
        self.beam_size = require_int("beam_search", "beam_size", beam_size)
        self.expansions = require_int("beam_search", "expansions", expansions)

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        run = self.start(prompt_ids, ctx)
        beams = [run.path]
        finished: list[tuple[StepDecoder, str, float]] = []  # (path, finish reason, last-step score)
        while beams and len(finished) < self.beam_size:
            ranked = self._expand(run, beams)[: self.beam_size - len(finished)]
            survivors, beams = self._advance(run, beams, ranked), []
            for path, score in survivors:
                finish = path.finish_reason()
                if finish is None:
                    beams.append(path)
                else:
                    finished.append((path, finish, score))
        path, finish, score = max(finished, key=lambda f: f[2])
        self.log_path(run, path, score)
        return run.result(path, finish, beams_finished=len(finished))

    def _expand(self, run: StepRun, beams: list[StepDecoder]) -> list[tuple[StepDecoder, Step, float]]:
        """Every beam's candidate steps with their rewards, best first (ties: earlier first)."""
        candidates = []
        for beam in beams:
            for _ in range(self.expansions):
                step = self.sample_step(run, beam)
                candidates.append((beam, step, self.last_step_score(run, beam, step)))
        return sorted(candidates, key=lambda c: -c[2])

    @staticmethod
    def _advance(run: StepRun, beams: list[StepDecoder], ranked: list[tuple[StepDecoder, Step, float]]) -> list[tuple[StepDecoder, float]]:
        """Commit each surviving candidate to its parent path. A parent with several surviving
        children is forked, reusing the sequences of parents that have none."""
        parents = {id(parent) for parent, _, _ in ranked}
        spare = [beam.models for beam in beams if id(beam) not in parents]
        claimed: set[int] = set()
        assigned = []
        for parent, step, score in ranked:
            if id(parent) in claimed:
                path = parent.fork(spare.pop() if spare else ModelSequences(run.ctx))
            else:
                claimed.add(id(parent))
                path = parent
            assigned.append((path, step, score))
        for path, step, _ in assigned:  # after all forks: each copied its parent before it advanced
            path.commit(step)
        return [(path, score) for path, _, score in assigned]
