"""draw_slip: one digit replaced by another of its family, where the model's own distribution puts it."""
from __future__ import annotations

import torch

from rstitch.testbed.slips import digit_families, draw_slip
from rstitch.testbed.tokenizer import load_tokenizer

TOK = load_tokenizer()
FAMILIES = digit_families(TOK)
TEXT = "Adding 38: 47 + 38 = 85. Check: 85 - 38 = 47."
IDS = TOK.encode(TEXT, add_special_tokens=False)


def confident(ids: list[int]) -> torch.Tensor:
    """A model sure of every token it wrote."""
    probs = torch.full((len(ids), len(TOK)), 1e-6)
    probs[torch.arange(len(ids)), torch.tensor(ids)] = 1.0
    return probs / probs.sum(-1, keepdim=True)


def test_slip_lands_where_the_model_doubts():
    probs = confident(IDS)
    t = TEXT.index("85") + 1  # the "5" of "85": the model gives "4" 40% there
    pos = next(i for i, (a, _) in enumerate(TOK(TEXT, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]) if a == t)
    four = TOK.convert_tokens_to_ids("4")
    probs[pos] = 0.0
    probs[pos, IDS[pos]], probs[pos, four] = 0.6, 0.4
    draws = [draw_slip(IDS, probs, FAMILIES, torch.Generator().manual_seed(s)) for s in range(20)]
    assert all(d == (pos, four) for d in draws)
    slipped = IDS[:pos] + [four]
    assert TOK.decode(slipped).endswith("47 + 38 = 84")


def test_slip_is_another_digit_of_the_same_family():
    probs = torch.softmax(torch.randn(len(IDS), len(TOK), generator=torch.Generator().manual_seed(0)), -1)
    for seed in range(50):
        t, new = draw_slip(IDS, probs, FAMILIES, torch.Generator().manual_seed(seed))
        fam = next(f for f in FAMILIES if IDS[t] in f.tolist())
        assert new in fam.tolist() and new != IDS[t]


def test_no_digit_no_slip():
    ids = TOK.encode("We start with", add_special_tokens=False)
    assert draw_slip(ids, confident(ids), FAMILIES, torch.Generator().manual_seed(0)) is None
