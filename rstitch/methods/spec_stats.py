"""Statistics of draft-and-verify decoding (SpecDec, EASD), per position as vLLM's SpecDecodingStats
(docs/speculative.md "Statistics"), and of small/large model agreement."""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

from rstitch.engines import ModelPair, ModelRunner, Sampler
from rstitch.methods.drafts import TokenVerdict


@dataclass
class SpecStats:
    k: int
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens kept in the output
    verifications: int = 0  # target passes that checked at least one draft token
    target_forward_calls: int = 0  # target passes, including those with no draft (budget tail)
    penalties: int = 0  # draft tokens rejected by EASD's entropy penalty
    accepted_per_position: list[int] = field(default_factory=list)
    reached_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_position = self.accepted_per_position or [0] * self.k
        self.reached_per_position = self.reached_per_position or [0] * self.k

    def record(self, drafted: int, verdict: TokenVerdict) -> None:
        """One target pass over `drafted` draft tokens."""
        self.target_forward_calls += 1
        if drafted == 0:
            return
        self.verifications += 1
        self.proposed += drafted
        self.accepted += verdict.accepted
        for position in range(verdict.accepted):
            self.accepted_per_position[position] += 1
            self.reached_per_position[position] += 1
        if verdict.rejected:
            self.reached_per_position[verdict.accepted] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "draft_tokens_proposed": self.proposed,
            "draft_tokens_accepted": self.accepted,
            "verifications": self.verifications,
            "target_forward_calls": self.target_forward_calls,
            "easd_penalties": self.penalties,
            "accepted_per_position": list(self.accepted_per_position),
            "reached_per_position": list(self.reached_per_position),
            "acceptance_rate": _ratio(self.accepted, self.proposed),
            "mean_accepted_length": _ratio(self.accepted, self.verifications),
            "acceptance_rate_per_position": _rates(self.accepted_per_position, self.reached_per_position),
        }


def summarize_spec(samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Run-level statistics: rates pooled over all verifications, counts as means per sample."""
    rows = [r for r in samples if r.get("stats", {}).get("verifications") is not None]
    if not rows:
        return {}
    stats = [r["stats"] for r in rows]
    total = lambda key: sum(s[key] for s in stats)  # noqa: E731
    accepted_at = [sum(c) for c in zip_longest(*(s["accepted_per_position"] for s in stats), fillvalue=0)]
    reached_at = [sum(c) for c in zip_longest(*(s["reached_per_position"] for s in stats), fillvalue=0)]
    mean = lambda key: statistics.fmean(s[key] for s in stats)  # noqa: E731
    return {
        "spec_acceptance_rate": _ratio(total("draft_tokens_accepted"), total("draft_tokens_proposed")),
        "spec_mean_accepted_length": _ratio(total("draft_tokens_accepted"), total("verifications")),
        "spec_tokens_per_target_forward": _ratio(sum(r["tokens"] for r in rows), total("target_forward_calls")),
        "spec_acceptance_rate_per_position": _rates(accepted_at, reached_at),
        "spec_draft_tokens_proposed": mean("draft_tokens_proposed"),
        "spec_draft_tokens_accepted": mean("draft_tokens_accepted"),
        "spec_verifications": mean("verifications"),
        "spec_target_forward_calls": mean("target_forward_calls"),
        "easd_penalties": mean("easd_penalties"),
    }


def greedy_consistency(pair: ModelPair, prompt_ids: Seq[int], max_new_tokens: int) -> tuple[int, int]:
    """(matches, positions) along the LLM's greedy trace: at how many positions the SLM's greedy
    token, given the same prefix, equals the LLM's (R-Stitch's token consistency, figure 1a)."""
    eos = set(pair.llm.eos_token_ids) | set(pair.slm.eos_token_ids)
    trace = pair.llm.new_sequence(prompt_ids).generate(max_new_tokens, Sampler(), eos_ids=eos).token_ids
    # One SLM pass scores every prefix of the trace.
    slm_predictions = pair.slm.new_sequence(prompt_ids).score(trace)[:-1]
    matches = sum(dist.argmax == token for dist, token in zip(slm_predictions, trace))
    return matches, len(trace)


def greedy_entropies(runner: ModelRunner, prompt_ids: Seq[int], max_new_tokens: int, eos_ids: Iterable[int]) -> list[float]:
    """The model's entropy (nats) at every position of its own greedy continuation."""
    eos = set(eos_ids)
    sequence = runner.new_sequence(prompt_ids)
    entropies: list[float] = []
    for _ in range(max_new_tokens):
        dist = sequence.next_distribution()
        entropies.append(dist.entropy)
        token = dist.argmax
        if token in eos:
            break
        sequence.append(token)
    return entropies


def mean_of_top_fraction(values: Seq[float], fraction: float) -> float:
    """Mean of the largest ceil(fraction * n) values (EASD's tau_H, eqs. 8-10)."""
    if not values:
        raise ValueError("no values to average")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    count = max(1, math.ceil(fraction * len(values)))
    return statistics.fmean(sorted(values, reverse=True)[:count])


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _rates(accepted: Seq[int], reached: Seq[int]) -> list[float | None]:
    return [_ratio(a, r) for a, r in zip(accepted, reached)]
