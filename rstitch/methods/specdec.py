"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) with EASD §3.1 eq. 1's acceptance
test (eps_i <= p_t(c_i) / p_d(c_i)); the papers' SD baselines use k = 7 (RSD §3) and k = 5 (SpecReason
§5.1). The algorithm, its caches and result fields: docs/speculative.md. p and q are the Sampler's
processed distributions, so under greedy decoding the output is the target's, token for token.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

from rstitch.engines import ModelPair, Sampler, Sequence, TokenDistribution, require
from rstitch.engines.base import StopWatcher
from rstitch.errors import ConfigError
from rstitch.methods.base import LLM, SLM, DecodeContext, DecodeResult, Method, register_method, require_int
from rstitch.methods.drafts import Draft, TokenVerdict
from rstitch.methods.spec_stats import SpecStats, summarize_spec


class DraftPenalty(Protocol):
    def applies(self, draft: TokenDistribution, target: TokenDistribution) -> bool:
        """Whether the draft token at this position is rejected regardless of the ratio test."""

    def replacement_probs(self, sampler: Sampler, target: TokenDistribution, token: int) -> torch.Tensor:
        """The distribution the target draws the replacement of a penalized `token` from."""


def draw(sampler: Sampler, probs: torch.Tensor) -> int:
    """A token from `probs`; the argmax under greedy decoding (one-hot inputs) without using the RNG."""
    return int(probs.argmax()) if sampler.greedy else sampler.sample_from(probs)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what the target adds where the draft under-proposes."""
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    # p == q admits no rejection in exact arithmetic; guard against rounding.
    return residual / total if total > 0 else p


def verify_draft_token(p: torch.Tensor, q: torch.Tensor, token: int, sampler: Sampler) -> int | None:
    """None when the draft token is accepted (with probability min(1, p(token) / q(token)), a
    uniform drawn only when that is below 1), else the target's replacement token."""
    p_token, q_token = float(p[token]), float(q[token])
    if p_token >= q_token or (p_token > 0.0 and sampler.uniform() < p_token / q_token):
        return None
    return draw(sampler, residual_distribution(p, q))


def check_vocabularies(ctx: DecodeContext) -> None:
    slm, llm = ctx.pair.slm, ctx.pair.llm
    if slm.vocab_size != llm.vocab_size:
        raise ConfigError(
            f"speculative decoding needs one vocabulary: SLM '{slm.name}' has {slm.vocab_size} tokens, "
            f"LLM '{llm.name}' has {llm.vocab_size}"
        )


@register_method("specdec")
class SpecDec(Method):
    """Lossless speculative decoding with a fixed draft length k; EASD adds its `penalty_for`."""

    family = "speculative"

    def __init__(self, k: int = 5):
        self.k = require_int(self.name, "k", k)

    def penalty_for(self, pair: ModelPair) -> DraftPenalty | None:
        return None

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        check_vocabularies(ctx)
        penalty = self.penalty_for(ctx.pair)
        if penalty is not None or not ctx.sampler.greedy:  # entropies; p(x)/q(x) and the residual
            for model in (ctx.pair.slm, ctx.pair.llm):
                require(model, "exact_distributions", "EASD or sampled speculative decoding")
        draft = ctx.pair.slm.new_sequence(prompt_ids)
        target = ctx.pair.llm.new_sequence(prompt_ids)
        stats = SpecStats(self.k)
        output, sources, finish = self.extend(draft, target, ctx, ctx.max_new_tokens, stats, penalty=penalty)
        return DecodeResult(output, sources, finish, stats.proposed - stats.accepted, stats.verifications, stats.as_dict())

    def extend(
        self, draft: Sequence, target: Sequence, ctx: DecodeContext, limit: int, stats: SpecStats,
        stop: tuple[str, ...] = (), penalty: DraftPenalty | None = None,
    ) -> tuple[list[int], list[int], str]:
        """Up to `limit` tokens after the two sequences' (equal) tokens, to EOS or a stop string (its
        block's later tokens rolled back: token-exact); (tokens, sources, "eos" | "stop" | "length").
        `penalty` adds a rejection rule (EASD)."""
        eos = ctx.eos_ids
        watcher = StopWatcher(ctx.pair.llm.tokenizer, stop)
        output: list[int] = []
        sources: list[int] = []
        while len(output) < limit:
            # The target adds one token per block, so draft one fewer than the tokens left.
            proposal = self._propose(draft, min(self.k, limit - len(output) - 1), ctx.sampler, eos)
            verdict = self._verify(proposal, target.score(proposal.tokens), ctx.sampler, eos, stats, penalty)
            stats.record(len(proposal.tokens), verdict)
            produced = self._advance(draft, target, proposal, verdict)
            block_sources = [SLM] * verdict.accepted + [LLM] * (len(produced) - verdict.accepted)
            for i, token in enumerate(produced):
                if token in eos or watcher.hit(token):
                    extra = len(produced) - i - 1
                    draft.rollback(extra)
                    target.rollback(extra)
                    return output + produced[: i + 1], sources + block_sources[: i + 1], "eos" if token in eos else "stop"
            output += produced
            sources += block_sources
        return output, sources, "length"

    @staticmethod
    def _propose(draft: Sequence, n: int, sampler: Sampler, eos: set[int]) -> Draft:
        proposal = Draft([], [], [])
        for _ in range(n):
            dist = draft.next_distribution()
            q = sampler.probs_from_logits(dist.logits)
            token = draw(sampler, q)
            draft.append(token)
            proposal.tokens.append(token)
            proposal.dists.append(dist)
            proposal.probs.append(q)
            if token in eos:  # nothing after EOS could be used
                break
        return proposal

    @staticmethod
    def _verify(
        proposal: Draft, target_dists: list[TokenDistribution], sampler: Sampler, eos: set[int], stats: SpecStats,
        penalty: DraftPenalty | None,
    ) -> TokenVerdict:
        for i, token in enumerate(proposal.tokens):
            target_dist = target_dists[i]
            if penalty is not None and penalty.applies(proposal.dists[i], target_dist):
                stats.penalties += 1
                return TokenVerdict(i, draw(sampler, penalty.replacement_probs(sampler, target_dist, token)), True)
            p = sampler.probs_from_logits(target_dist.logits)
            replacement = verify_draft_token(p, proposal.probs[i], token, sampler)
            if replacement is not None:
                return TokenVerdict(i, replacement, True)
            if token in eos:
                return TokenVerdict(i + 1, None, False)
        bonus = draw(sampler, sampler.probs_from_logits(target_dists[-1].logits))
        return TokenVerdict(len(proposal.tokens), bonus, False)

    @staticmethod
    def _advance(draft: Sequence, target: Sequence, proposal: Draft, verdict: TokenVerdict) -> list[int]:
        """Drop the rejected draft tokens from both caches and append the target's token."""
        produced = proposal.tokens[: verdict.accepted]
        rejected = len(proposal.tokens) - verdict.accepted
        draft.rollback(rejected)
        target.rollback(rejected)
        if verdict.target_token is not None:
            draft.append(verdict.target_token)
            target.append(verdict.target_token)
            produced.append(verdict.target_token)
        return produced

    def summarize(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return summarize_spec(samples)
