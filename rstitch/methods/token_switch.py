"""The loop shared by token-level hybrid methods: at every position one model produces the token
(R-Stitch §3.2.2 and Algorithm 1 in appendix A.3, with the partial prefill of its KV cache management).
A policy whose decisions are entropy thresholds also gives them as a `SwitchRule` per model, so
the engine decodes a whole run in one call (one vLLM request instead of one per token).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from rstitch.engines import Sequence, TokenDistribution
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult
from rstitch.scorers.prefix_cache import common_prefix_length


class SwitchPolicy(ABC):
    """Which model writes each position. A policy may also give `rule(source) -> SwitchRule`: `keep`
    and `next` of `source` as one rule, so the engine decodes a whole run (its run ends at the first
    token whose `next` is the other model, kept, or that `keep` refuses, dropped; after a dropped
    token the other model's first token must be kept: its rule may only end with `keep_last`)."""

    want_hidden = False  # the SLM's distributions carry its last hidden state (the R-Stitch+ router reads them)

    def first(self) -> int:
        """The model that writes the first token (Algorithm 1: the SLM)."""
        return SLM

    def keep(self, source: int, dist: TokenDistribution) -> bool:
        """Whether `source` may write this position (False hands it to the other model)."""
        return True

    @abstractmethod
    def next(self, source: int, dist: TokenDistribution) -> int:
        """The model for the next position, given the distribution that produced this token."""


class ModelSequences:
    """One sequence per model for one sample, opened at first use: `synced` catches it up with an
    output that only grows after `prompt_ids`; `aligned` rolls it back to any token list's shared prefix."""

    def __init__(self, ctx: DecodeContext, prompt_ids: list[int] | None = None, want_hidden: bool = False):
        self.ctx, self.prompt_ids, self.want_hidden = ctx, prompt_ids or [], want_hidden
        self.seqs: dict[int, Sequence] = {}

    def _open(self, source: int, tokens: list[int]) -> Sequence:
        # Only the SLM's states are read: the LLM (on vLLM, a second engine) never returns them.
        seq = self.seqs[source] = self.ctx.runner(source).new_sequence(tokens, self.want_hidden and source == SLM)
        return seq

    def synced(self, source: int, output: list[int]) -> Sequence:
        seq = self.seqs.get(source)
        if seq is None:
            seq = self._open(source, self.prompt_ids)
        seq.append(output[len(seq) - len(self.prompt_ids):])
        return seq

    def aligned(self, source: int, tokens: list[int]) -> Sequence:
        seq = self.seqs.get(source)
        if seq is None:
            return self._open(source, tokens)
        keep = common_prefix_length(seq.tokens, tokens)
        seq.rollback(len(seq) - keep)
        seq.append(tokens[keep:])
        return seq

    def truncate(self, n_output: int, *sources: int) -> None:
        """Roll the sequences of `sources` back to the prompt and the first `n_output` output tokens."""
        for seq in (self.seqs[s] for s in sources if s in self.seqs):
            seq.rollback(max(0, len(seq) - len(self.prompt_ids) - n_output))


def switch_decode(prompt_ids: list[int], ctx: DecodeContext, policy: SwitchPolicy) -> DecodeResult:
    models = ModelSequences(ctx, prompt_ids, policy.want_hidden)
    state = SwitchState(policy.first())
    rule = getattr(policy, "rule", None)
    while len(state.output) < ctx.max_new_tokens and state.finish != "eos":
        if rule is None:
            switch_step(models, ctx, policy, state)
        else:  # one model's run of tokens under its rule, in one engine call
            seq = models.synced(state.source, state.output)
            run = seq.decode_until(ctx.max_new_tokens - len(state.output), ctx.sampler, rule(state.source), eos_ids=ctx.eos_ids)
            state.write(run.token_ids, ctx.eos_ids)
            if run.finish_reason == "switch":
                state.hand_over(run.dropped)
    return DecodeResult(state.output, state.sources, state.finish, state.discarded, state.switches)


class SwitchState:
    """The shared output of one sample, and the model that writes its next position."""

    def __init__(self, source: int):
        self.source = source
        self.output: list[int] = []
        self.sources: list[int] = []
        self.discarded = self.switches = 0
        self.finish = "length"

    def write(self, tokens: list[int], eos: set[int] | list[int]) -> None:
        self.output += tokens
        self.sources += [self.source] * len(tokens)
        if tokens and tokens[-1] in eos:
            self.finish = "eos"

    def hand_over(self, dropped: bool) -> None:
        self.discarded += dropped
        self.switches += 1
        self.source = LLM if self.source == SLM else SLM


def switch_step(models: ModelSequences, ctx: DecodeContext, policy: SwitchPolicy, state: SwitchState) -> None:
    """One position, decided by the policy's Python code."""
    dist = models.synced(state.source, state.output).next_distribution()
    if not policy.keep(state.source, dist):
        state.hand_over(dropped=True)
        dist = models.synced(state.source, state.output).next_distribution()
    state.write([ctx.sampler.sample(dist)], ctx.eos_ids)
    if state.finish != "eos" and policy.next(state.source, dist) != state.source:
        state.hand_over(dropped=False)
