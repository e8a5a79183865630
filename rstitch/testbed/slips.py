"""A model's own likeliest slips, drawn from its next-token distributions.

The LLM's real mistakes are rare (about 6% of its sampled steps), and a PRM whose body is the LLM
shares the LLM's blind spots: it misses exactly those. `draw_slip` makes one such mistake on
demand. Given a clean solution and the model's distribution at each of its tokens, it replaces one
digit token by another digit, drawn where and as the model itself would write one at temperature 1:
the position is weighted by the probability the model gives a *different* digit there, and the
replacement by the model's probabilities of the other digits. The training script lets the model
write the rest of the solution from the slip (`scripts/train_testbed.py`, `near_misses`).
"""
from __future__ import annotations

from typing import Sequence

import torch


def digit_families(tokenizer) -> list[torch.Tensor]:
    """Token ids of the digits "0".."9" and of " 0".." 9": a slip keeps a digit's family (the testbed
    tokenizer writes a number's first digit with its leading space)."""
    families = []
    for prefix in ("", " "):
        ids = [tokenizer.encode(prefix + str(d), add_special_tokens=False) for d in range(10)]
        if any(len(x) != 1 for x in ids):
            raise ValueError(f"tokenizer does not write {prefix + '0'!r}..{prefix + '9'!r} as single tokens")
        families.append(torch.tensor([x[0] for x in ids]))
    return families


def draw_slip(
    token_ids: Sequence[int], probs: torch.Tensor, families: list[torch.Tensor], generator: torch.Generator
) -> tuple[int, int] | None:
    """(position, slipped token id) for a solution `token_ids` whose token t the model predicts with
    distribution `probs[t]` ([len(token_ids), vocab]); None if the solution has no digit."""
    ids = torch.as_tensor(list(token_ids))
    p_other = torch.zeros(len(ids))  # 0 off the digits
    for fam in families:
        on = torch.isin(ids, fam)
        own = probs[on].gather(1, ids[on, None])[:, 0]
        p_other[on] = (probs[on][:, fam].sum(-1) - own).clamp(min=1e-9)
    if not p_other.any():
        return None
    t = int(torch.multinomial(p_other, 1, generator=generator))
    fam = next(f for f in families if bool((f == ids[t]).any()))
    weights = probs[t, fam].clamp(min=1e-9) * (fam != ids[t])
    return t, int(fam[torch.multinomial(weights, 1, generator=generator)])
