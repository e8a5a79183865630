"""What a drafter proposes and what a verifier rules, in vLLM's spec_decode terms (a proposal the
target scores): the token family (SpecDec, EASD) proposes a `Draft` of tokens ruled on by a
`TokenVerdict`; the step family (RSD, SpecReason, Arbitrage) a `Step` ruled on by a `Verdict`."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rstitch.engines import TokenDistribution


@dataclass
class Draft:
    """Tokens the draft model proposed, with what it knew drawing them."""
    tokens: list[int]
    dists: list[TokenDistribution]  # the draft model's raw distributions (entropy, log-probs)
    probs: list[torch.Tensor]  # the processed distributions the tokens were drawn from


@dataclass
class TokenVerdict:
    """The target's ruling on a `Draft`: how many of its tokens stay and the token it adds."""
    accepted: int  # draft tokens kept
    target_token: int | None  # replacement or bonus; None when an accepted EOS ends the output
    rejected: bool  # the block ended on a rejection (not on EOS or after the whole draft)


@dataclass
class Step:
    """One reasoning step a model wrote after the committed steps (not yet committed)."""
    token_ids: list[int]
    text: str  # without the separator and surrounding whitespace: what PRMs, judges, routers read
    source: int  # SLM or LLM
    finish: str  # "separator" | "eos" | "step_cap" | "budget"


@dataclass
class Verdict:
    """A verifier's ruling on a drafted step."""
    accept: bool
    score: float | None = None  # what the verifier read (reward, judge score, router y_hat)
