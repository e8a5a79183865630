"""The loop shared by token-level hybrid methods: at every position one model produces the token.

A `SwitchPolicy` picks the starting model, may reject the SLM's token at a position (the LLM then
produces that position instead), and picks the model for the next position. Each model keeps its
own sequence (KV cache) and catches up by partial prefill of the tokens the other model wrote
since it last ran.
"""
from __future__ import annotations

from typing import Protocol

from rstitch.engines import Sequence, TokenDistribution
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult


class SwitchPolicy(Protocol):
    want_hidden: bool  # the SLM's distributions carry its last hidden state (the R-Stitch+ router reads them)

    def first(self) -> int:
        """The model that writes the first token."""

    def keep(self, source: int, dist: TokenDistribution) -> bool:
        """Whether `source` may write this position (False hands it to the other model)."""

    def next(self, source: int, dist: TokenDistribution) -> int:
        """The model for the next position, given the distribution that produced this token."""


class _Catchup:
    """Lazily opened per-model sequences that are brought up to date with the shared output."""

    def __init__(self, prompt_ids: list[int], ctx: DecodeContext, want_hidden: bool):
        self.prompt_ids, self.ctx, self.want_hidden = prompt_ids, ctx, want_hidden
        self.seqs: dict[int, Sequence] = {}

    def synced(self, source: int, output: list[int]) -> Sequence:
        seq = self.seqs.get(source)
        if seq is None:
            # Only the SLM's states are read: the LLM (on vLLM, a second engine) never returns them.
            seq = self.ctx.runner(source).new_sequence(self.prompt_ids, self.want_hidden and source == SLM)
            self.seqs[source] = seq
        seq.append(output[len(seq) - len(self.prompt_ids):])
        return seq


def switch_decode(prompt_ids: list[int], ctx: DecodeContext, policy: SwitchPolicy) -> DecodeResult:
    models = _Catchup(prompt_ids, ctx, policy.want_hidden)
    eos = ctx.eos_ids
    output: list[int] = []
    sources: list[int] = []
    discarded = switches = 0
    source = policy.first()
    finish = "length"
    while len(output) < ctx.max_new_tokens:
        dist = models.synced(source, output).next_distribution()
        if not policy.keep(source, dist):
            discarded += 1
            switches += 1
            source = LLM if source == SLM else SLM
            dist = models.synced(source, output).next_distribution()
        token = ctx.sampler.sample(dist)
        output.append(token)
        sources.append(source)
        if token in eos:
            finish = "eos"
            break
        following = policy.next(source, dist)
        switches += following != source
        source = following
    return DecodeResult(output, sources, finish, discarded, switches)
