"""Whether a prompt plus its generation budget fits the models' context windows, and what
`on_overflow` (error, skip, truncate: docs/reliability.md) makes of a problem that does not: a
model decoding past its trained positions still produces tokens, and they would get graded."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from rstitch.errors import ConfigError

OVERFLOW_POLICIES = ("error", "skip", "truncate")


def context_length(model: Any) -> int | None:
    """The positions a loaded model supports (vLLM's max_model_len, else the HF config's
    max_position_embeddings), or None when it does not say."""
    limit = getattr(model, "max_model_len", None)
    if limit is None:
        config = getattr(getattr(model, "model", None), "config", None)
        limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


class ContextCheck:
    """The budget of each problem under one pair's context and an `on_overflow` policy."""

    def __init__(self, pair: Any, budget: int, policy: str = "error"):
        if policy not in OVERFLOW_POLICIES:
            raise ConfigError(f"on_overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {policy!r}")
        limits = [n for n in (context_length(m) for m in pair.models().values()) if n is not None]
        self.limit = min(limits) if limits else None
        self.budget, self.policy = budget, policy
        self.tokenizer = pair.tokenizer

    def prompt_ids(self, problem_id: str, problem: str, encode) -> tuple[list[int], int] | None:
        """(prompt ids, this problem's budget), or None when it is skipped. A problem too long
        to fit even at the tokenizer's longest token is judged without tokenizing it."""
        if self.limit is None:
            return encode(problem), self.budget
        ids = None if len(problem) > self.limit * _longest_token_chars(self.tokenizer) else encode(problem)
        room = 0 if ids is None else self.limit - len(ids)
        if ids is not None and room >= self.budget:
            return ids, self.budget
        if self.policy == "truncate" and ids is not None and room >= 1:
            return ids, room
        if self.policy == "error":
            size = f"a prompt of {len(ids)} tokens" if ids is not None else "a prompt far longer"
            raise ConfigError(f"problem '{problem_id}': {size} + max_new_tokens={self.budget} exceeds the "
                              f"{self.limit}-token context of the pair (on_overflow=skip or truncate to go on)")
        return None


@lru_cache(maxsize=8)
def _longest_token_chars(tokenizer: Any) -> int:
    """No token covers more characters than the longest vocabulary entry (an upper bound)."""
    return max(map(len, tokenizer.get_vocab()), default=1)
