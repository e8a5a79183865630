import pytest
import torch

from rstitch.engines import Sampler


def full_forward_logits(runner, ids):
    with torch.no_grad():
        return runner.model(torch.tensor([ids])).logits[0, :, : runner.vocab_size].float()


def test_partial_prefill_and_rollback_match_full_forward(tiny_runners):
    llm = tiny_runners.llm
    ids = list(range(5, 30))
    ref = full_forward_logits(llm, ids)
    seq = llm.new_sequence(ids[:10])
    torch.testing.assert_close(seq.next_distribution().logits, ref[9], rtol=1e-4, atol=1e-4)
    seq.append(ids[10:20])  # partial prefill: only the 10 new tokens run
    before = llm.cost.prefill_tokens
    torch.testing.assert_close(seq.next_distribution().logits, ref[19], rtol=1e-4, atol=1e-4)
    assert llm.cost.prefill_tokens - before == 10
    seq.rollback(7)  # outside the kept window: the last token is recomputed
    torch.testing.assert_close(seq.next_distribution().logits, ref[12], rtol=1e-4, atol=1e-4)
    seq.append([60, 61, 62])
    alt = full_forward_logits(llm, ids[:13] + [60, 61, 62])
    torch.testing.assert_close(seq.next_distribution().logits, alt[-1], rtol=1e-4, atol=1e-4)


def test_score_returns_one_distribution_per_continuation_token_in_one_forward(tiny_runners):
    llm = tiny_runners.llm
    ids = list(range(5, 25))
    ref = full_forward_logits(llm, ids)
    seq = llm.new_sequence(ids[:12])
    seq.next_distribution()
    calls = llm.cost.forward_calls
    dists = seq.score(ids[12:])
    assert llm.cost.forward_calls == calls + 1
    assert len(dists) == 9
    for i, d in enumerate(dists):
        torch.testing.assert_close(d.logits, ref[11 + i], rtol=1e-4, atol=1e-4)
    # Rolling back inside the scored window costs no forward.
    seq.rollback(3)
    torch.testing.assert_close(seq.next_distribution().logits, ref[16], rtol=1e-4, atol=1e-4)
    assert llm.cost.forward_calls == calls + 1


def test_distribution_statistics(tiny_runners):
    seq = tiny_runners.slm.new_sequence([5, 6, 7], want_hidden=True)
    d = seq.next_distribution()
    assert 0.0 <= d.normalized_entropy <= 1.0
    assert abs(float(d.probs.sum()) - 1) < 1e-5
    ids, probs = d.topk(3)
    assert ids[0] == d.argmax and probs[0] >= probs[1] >= probs[2]
    assert d.hidden is not None and d.hidden.shape == (tiny_runners.slm.hidden_size,)


def test_generate_stops_at_stop_string_eos_or_limit(tiny_runners):
    tok = tiny_runners.llm.tokenizer
    seq = tiny_runners.llm.new_sequence(tok.encode("abc"))
    out = seq.generate(12, Sampler())
    assert len(out.token_ids) <= 12 and out.finish_reason in {"eos", "length"}
    # A stop string made of the first generated characters ends generation right there.
    text = tok.decode(out.token_ids[:3])
    seq2 = tiny_runners.llm.new_sequence(tok.encode("abc"))
    out2 = seq2.generate(12, Sampler(), stop=[text[1:3]] if len(text) >= 3 else [])
    if len(text) >= 3 and out.finish_reason != "eos":
        assert out2.finish_reason == "stop" and out2.token_ids == out.token_ids[:3]


def test_sampler_rejects_bad_values():
    from rstitch.errors import ConfigError

    with pytest.raises(ConfigError):
        Sampler(temperature=-1)
    with pytest.raises(ConfigError):
        Sampler(temperature=0.5, top_p=0)
