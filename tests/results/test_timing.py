"""Timings that hold on a shared machine: each CPU sample's decode CPU time beside its wall clock,
the speedup in CPU time beside the wall-clock one, and the contention flag pointing to it
(docs/analysis.md, "Timings on a shared machine")."""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time

import pytest

from rstitch.results.measurement import CONTENTION_ADVICE, contention_notes
from rstitch.results.metrics import (
    compare_with_baseline,
    mean_of_every,
    sample_cpu_time,
    self_comparison,
    speedups_against,
    summarize_samples,
)
from rstitch.results.summary import format_table


def sample(problem: str, wall_s: float, cpu_s: float | None, device: str = "cpu", tokens: int = 10) -> dict:
    return {"id": problem, "sample_index": 0, "correct": True, "latency_s": wall_s, "tokens": tokens,
            "tokens_slm": 0, "tokens_llm": tokens, "discarded_tokens": 0, "switches": 0, "flops": 1.0,
            "finished_by_eos": True, "cost": {m: {"forward_time_s": 0.0, "forward_calls": 1} for m in ("slm", "llm")},
            "measurement": {"threads": 1, "device": device, "cpus": 2, "load_1m": 1.0, "cpu_s": cpu_s,
                            "cpu_clock": "thread", "cpu_per_wall": None if cpu_s is None else cpu_s / wall_s}}


def test_cpu_time_is_summarized_on_a_cpu_only():
    rows = [sample("a", 2.0, 1.0), sample("b", 4.0, 3.0)]
    assert summarize_samples(rows)["latency_cpu_s"] == pytest.approx(2.0)
    assert mean_of_every(map(sample_cpu_time, [sample("a", 2.0, 1.0, device="cuda:0")])) is None  # the CPU only launches kernels there
    assert mean_of_every(map(sample_cpu_time, [sample("a", 2.0, 1.0), sample("b", 2.0, None)])) is None  # a batched sample has none
    assert mean_of_every(map(sample_cpu_time, [{"latency_s": 1.0}])) is None  # a run from before measurements


def test_the_cpu_speedup_is_the_ratio_of_cpu_times_beside_the_wall_clock_one():
    # A loaded sitting: the baseline's wall clock tripled by other jobs, its CPU time not.
    baseline = {"latency_s": 3.0, "latency_cpu_s": 1.0, "tokens_per_s": 10.0}
    run = {"latency_s": 0.5, "latency_cpu_s": 0.4, "tokens_per_s": 20.0}
    out = speedups_against(run, baseline)
    assert out["speedup"] == pytest.approx(6.0) and out["speedup_cpu"] == pytest.approx(2.5)
    assert speedups_against({"latency_s": 0.5, "latency_cpu_s": None}, baseline)["speedup_cpu"] is None  # a GPU run
    assert self_comparison({"latency_cpu_s": 1.0})["speedup_cpu"] == 1.0
    assert self_comparison({"latency_cpu_s": None})["speedup_cpu"] is None


def test_the_paired_comparison_gives_the_cpu_speedup_an_interval(tmp_path):
    base_rows = [sample(p, 3.0, 1.0 + i / 10) for i, p in enumerate("abcd")]
    run_rows = [sample(p, 0.9, 0.5 + i / 20) for i, p in enumerate("abcd")]
    base_dir = tmp_path / "llm_only" / "x"
    base_dir.mkdir(parents=True)
    (base_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base_rows))
    key = {"k": 1}
    base_summary = {"method": "llm_only", "comparison_key": key, **summarize_samples(base_rows)}
    (base_dir / "summary.json").write_text(json.dumps(base_summary))
    out = compare_with_baseline({"method": "rstitch", "comparison_key": key, **summarize_samples(run_rows)}, run_rows, tmp_path)
    assert out["speedup_cpu"] == pytest.approx(1.15 / 0.575)
    low, high = out["speedup_cpu_ci"]
    assert low <= out["speedup_cpu"] <= high and out["speedup"] == pytest.approx(3.0 / 0.9)


def test_the_console_table_leads_with_the_cpu_speedup():
    header, row = format_table({"method": "rstitch", "speedup": 6.0, "speedup_cpu": 2.5, "speedup_cpu_ci": [2.0, 3.0]}).splitlines()
    cells = dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip())))
    assert header.index("cpu_speedup") < header.index("wall_speedup")
    assert cells["cpu_speedup [95% CI]"] == "2.50 [2.00, 3.00]" and cells["wall_speedup [95% CI]"] == "6.00"


def test_the_contention_flag_points_to_the_cpu_speedup():
    flagged = {"method": "rstitch", "run_tag": "tau=0.02_ab", "contention": "load average 5.7 on 2 CPUs", "speedup_cpu": 2.31}
    notes = contention_notes([flagged])
    assert notes[0] == ("! rstitch tau=0.02_ab: latency measured under contention (load average 5.7 on 2 CPUs); "
                        "its CPU-time speedup 2.31x holds, its wall-clock one does not")
    assert "CPU-time speedup" in CONTENTION_ADVICE and notes[-1] == f"! {CONTENTION_ADVICE}"
    gpu = {**flagged, "speedup_cpu": None}  # wall clock is all a GPU run has: the old advice stands alone
    assert contention_notes([gpu])[0].endswith("(load average 5.7 on 2 CPUs)")


@pytest.fixture(scope="module")
def decoded_beside_a_busy_thread(tmp_path_factory):
    """A testbed run decoded while another thread of this process hashes (without the GIL) all along."""
    from rstitch.cli.run import compose_config
    from rstitch.runner import run_config

    root = tmp_path_factory.mktemp("busy")
    stop = threading.Event()

    def hash_until_stopped() -> None:
        block = b"x" * (1 << 24)
        while not stop.is_set():
            hashlib.sha256(block).digest()  # hashlib drops the GIL for large inputs: real parallel CPU work

    busy = threading.Thread(target=hash_until_stopped, daemon=True)
    busy.start()
    try:
        run_config(compose_config(["method=llm_only", f"results_root={root}", "logger=none", "dataset.limit=2",
                                   "max_new_tokens=24"]))
    finally:
        stop.set()
        busy.join()
    [samples] = list(root.rglob("samples.jsonl"))
    return [json.loads(line) for line in samples.read_text().splitlines()]


def test_a_one_thread_decode_is_timed_on_its_own_thread_clock(decoded_beside_a_busy_thread):
    for row in decoded_beside_a_busy_thread:
        measured = row["measurement"]
        assert measured["threads"] == 1 and measured["cpu_clock"] == "thread"
        # One thread cannot use more CPU time than the wall clock passed; the process's clock, which
        # the hashing thread also advances, can.
        assert 0 < measured["cpu_s"] <= row["latency_s"] * 1.01


def test_decode_cpu_clock_by_threads():
    from rstitch.runner import decode_cpu_clock

    assert decode_cpu_clock(1) is time.thread_time and decode_cpu_clock(4) is time.process_time
