"""Batched decoding (`batch_size`): outputs independent of the batch, batch-1 runs unchanged."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rstitch.cli.run import CONF_DIR, compose_config
from rstitch.engines.base import CostCounter, ForwardRequest
from rstitch.engines.batching import BatchAborted, BatchScheduler
from rstitch.errors import ConfigError
from rstitch.results.keys import run_key, run_tag
from rstitch.runner import run

METHODS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
# The fast tier (-m "not slow") keeps one method per family: token-level, speculative, step-level.
FAST_METHODS = {"rstitch", "specdec", "rsd"}
METHOD_PARAMS = [pytest.param(m, marks=() if m in FAST_METHODS else pytest.mark.slow) for m in METHODS]
# Search baselines decode several candidates per sample: fewer keep the test short.
FEWER_CANDIDATES = {"best_of_n": ["method.n=2"], "maj": ["method.n=2"], "process_bon": ["method.n=2"],
                    "beam_search": ["method.beam_size=2", "method.expansions=2"]}


def config(tmp_path: Path, *overrides: str) -> dict:
    cfg = compose_config(["logger=none", f"results_root={tmp_path}", "engine.num_threads=1", *overrides])
    cfg.pop("logger")
    cfg.pop("results_root")
    return cfg


def outputs(run_dir: Path) -> dict[tuple[str, int], dict]:
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {(r["id"], r["sample_index"]): r for r in rows}


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("method", METHOD_PARAMS)
def test_batch_8_decodes_what_batch_1_decodes(tmp_path, method, temperature):
    # 4 problems x 2 samples: 8 samples in flight at once, joining and leaving at different steps
    common = [f"method={method}", "dataset.limit=4", "n_samples=2", "max_new_tokens=32", f"decoding.temperature={temperature}",
              *FEWER_CANDIDATES.get(method, [])]
    one = run(config(tmp_path, *common, "batch_size=1"), tmp_path / "b1")
    eight = run(config(tmp_path, *common, "batch_size=8"), tmp_path / "b8")
    single, batched = outputs(tmp_path / "b1"), outputs(tmp_path / "b8")
    assert set(single) == set(batched) and len(single) == 8
    for key, row in single.items():
        assert batched[key]["output_token_ids"] == row["output_token_ids"], key
        assert batched[key]["token_sources"] == row["token_sources"], key
        # each sample's own forwards, so the same latency estimate as at batch 1
        assert batched[key]["cost"] == {k: {**c, "forward_time_s": batched[key]["cost"][k]["forward_time_s"]}
                                        for k, c in row["cost"].items()}, key
        assert batched[key]["latency_estimate_s"] == pytest.approx(row["latency_estimate_s"])
        assert batched[key]["latency_s"] == pytest.approx(row["latency_estimate_s"] + batched[key]["latency_overhead_s"])
        assert batched[key]["latency_estimated"] is True and batched[key]["batch_wall_s"] > 0
        assert "latency_estimated" not in row and "batch_wall_s" not in row
    assert (one["batch_size"], eight["batch_size"]) == (1, 8)
    assert one["latency_estimated"] is False and eight["latency_estimated"] is True
    assert eight["decoded_samples"] == 8 and eight["decode_wall_s"] > 0
    assert eight["samples_per_s"] == pytest.approx(8 / eight["decode_wall_s"])


def test_batch_1_keeps_its_run_key_and_resumes_runs_made_before_batching(tmp_path):
    before = config(tmp_path, "dataset.limit=2", "max_new_tokens=16")
    del before["batch_size"]  # a configuration from before the knob existed
    now = {**before, "batch_size": 1}
    assert run_key(now) == run_key(before) and run_tag(now) == run_tag(before)
    run(before, tmp_path / "run")
    again = run(now, tmp_path / "run")
    assert again["decoded_samples"] == 0 and again["decode_wall_s"] is None and again["n_samples"] == 2
    batched = {**before, "batch_size": 4}
    assert run_key(batched)["batch_size"] == 4 and "batch=4" in run_tag(batched) and run_tag(batched) != run_tag(now)


def test_a_batched_run_resumes_and_refills_slots(tmp_path):
    cfg = config(tmp_path, "dataset.limit=7", "max_new_tokens=24", "batch_size=3")
    run(cfg, tmp_path / "run")
    first = outputs(tmp_path / "run")
    samples = tmp_path / "run" / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:2]))  # interrupted after 2
    summary = run(cfg, tmp_path / "run")
    assert summary["decoded_samples"] == 5 and summary["n_samples"] == 7
    assert {k: r["output_token_ids"] for k, r in outputs(tmp_path / "run").items()} == {
        k: r["output_token_ids"] for k, r in first.items()}


@pytest.mark.parametrize("value", [0, -2, 1.5, "4", True])
def test_batch_size_must_be_a_positive_integer(tmp_path, value):
    cfg = {**config(tmp_path, "dataset.limit=1"), "batch_size": value}
    with pytest.raises(ConfigError, match="^batch_size must be an integer >= 1"):
        run(cfg, tmp_path / "run")


@pytest.mark.parametrize("latency_dir", ["null", "EMPTY"])
def test_batching_needs_the_batch_1_latency_model(tmp_path, latency_dir):
    (tmp_path / "empty").mkdir()
    where = tmp_path / "empty" if latency_dir == "EMPTY" else latency_dir
    with pytest.raises(ConfigError, match="^batch_size > 1 estimates batch-1 latency .* none were found"):
        run(config(tmp_path, "dataset.limit=1", "batch_size=2", f"latency_dir={where}"), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # one error line before any result file


# --- the engine side ----------------------------------------------------------------------------
def test_hf_batched_forward_matches_one_by_one_with_rollbacks_joins_and_leaves(tiny_runners, monkeypatch):
    """Rows with different cached lengths, new-token counts, kept logits and rollbacks, rows that
    skip a round or join late, a cache that grows: one padded forward equals each row's own
    forward up to rounding."""
    from rstitch.engines.hf import SlotCache

    torch.set_num_threads(1)
    monkeypatch.setattr(SlotCache, "INITIAL", (2, 16))
    monkeypatch.setattr(tiny_runners.llm, "_slots", None)
    model, rng = tiny_runners.llm, random.Random(0)
    vocab = model.vocab_size
    pairs = []
    worst = 0.0
    for _ in range(40):
        if len(pairs) < 6 and rng.random() < 0.4:  # a row joins
            prompt = [rng.randrange(2, vocab) for _ in range(rng.randrange(3, 30))]
            pairs.append((model.new_sequence(prompt, want_hidden=len(pairs) == 1), model.new_sequence(prompt, want_hidden=len(pairs) == 1)))
        if pairs and rng.random() < 0.1:  # a row leaves
            pairs.pop(rng.randrange(len(pairs)))
        batch, expected = [], []
        for alone, batched in pairs:
            if rng.random() < 0.3:
                continue
            if len(alone) > 8 and rng.random() < 0.3:
                back = rng.randrange(1, 6)
                alone.rollback(back), batched.rollback(back)
            new = [rng.randrange(2, vocab) for _ in range(rng.choice([0, 1, 1, 4]))]
            keep = min(rng.choice([1, 1, 3]), len(new) + 1)  # score(x) keeps len(x) + 1 positions
            cut = len(new) - (keep - 1)
            alone.append(new[:cut])
            expected.append(alone.score(new[cut:]))
            batched.append(new)
            batch.append(_request(model, batched, keep))
        if not batch:
            continue
        for (logits, hidden), want, request in zip(model.forward_batch(batch), expected, batch):
            request.seq.n_cached = len(request.seq.tokens)
            assert logits.argmax(-1).tolist() == [d.logits.argmax().item() for d in want]
            worst = max(worst, (logits - torch.stack([d.logits for d in want])).abs().max().item())
            if request.seq.want_hidden:
                assert torch.allclose(hidden, torch.stack([d.hidden for d in want]), atol=1e-4)
            else:
                assert hidden is None
    assert worst < 1e-3 and model._slots.slots >= 4 and model._slots.length >= 64


def _request(model, seq, keep: int) -> ForwardRequest:
    """What `_ensure_processed` would submit for `seq` (re-running positions whose logits are gone)."""
    if seq.n_pending < keep:
        back = min(keep, len(seq.tokens)) - seq.n_pending
        seq._crop(seq.n_cached - back)
        seq.n_cached -= back
    return ForwardRequest(model, seq, seq.tokens[seq.n_cached:], keep)


def test_scheduler_keeps_batch_size_in_flight_and_each_sample_its_own_costs(tiny_runners):
    model = tiny_runners.slm
    in_flight, peak = set(), [0]
    counter = CostCounter()  # a counter outside the pair (a PRM's): also one view per sample

    def job(index: int):
        def decode():
            in_flight.add(index)
            peak[0] = max(peak[0], len(in_flight))
            seq = model.new_sequence([2 + index] * (3 + index))
            for _ in range(2 + index % 3):
                seq.append(seq.next_distribution().argmax)
            counter.forward_calls += index
            in_flight.discard(index)
            return model.cost.as_dict(), counter.forward_calls
        return decode

    done = list(BatchScheduler(3).run([(i, job(i)) for i in range(7)]))
    assert sorted(d.key for d in done) == list(range(7)) and peak[0] == 3
    for d in done:
        cost, extra = d.value
        assert cost["forward_calls"] == 2 + d.key % 3 and cost["prefill_tokens"] == 3 + d.key and extra == d.key
    assert counter.forward_calls == sum(range(7))  # the counter's own total: every sample's work


def test_a_failing_sample_fails_the_run_and_unwinds_the_others(tiny_runners):
    model = tiny_runners.slm
    started, unwound = [], []

    def job(index: int):
        def decode():
            started.append(index)
            seq = model.new_sequence([3, 4, 5])
            try:
                for _ in range(3):
                    seq.append(seq.next_distribution().argmax)
                if index == 2:
                    raise ConfigError("sample 2 fails")
                for _ in range(50):
                    seq.append(seq.next_distribution().argmax)
            except BatchAborted:
                unwound.append(index)
                raise
        return decode

    with pytest.raises(ConfigError, match="sample 2 fails"):
        list(BatchScheduler(4).run([(i, job(i)) for i in range(6)]))
    assert sorted(started) == [0, 1, 2, 3] and sorted(unwound) == [0, 1, 3]  # 4 and 5 never start


def test_rows_of_very_different_widths_run_as_separate_forwards():
    from rstitch.engines.hf_forward import width_groups

    assert width_groups([1, 1, 1, 30, 1]) == [[0, 1, 2, 4], [3]]  # a catch-up prefill beside single steps
    assert width_groups([1] * 16) == [list(range(16))] and width_groups([5, 6, 7, 8]) == [[0, 1, 2, 3]]
    groups = width_groups([1, 40, 2, 38, 3, 1, 17])
    assert sorted(i for g in groups for i in g) == list(range(7))
