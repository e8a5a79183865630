"""The speedup in the latency model's estimate (`speedup_estimate`): the forwards each decode ran, each
at its fitted cost, so other jobs on the cores do not move it (docs/analysis.md, "Timings on a shared
machine"). Beside the wall-clock and CPU-time speedups in summaries, the console and sweep tables, the
contention flag and the W&B sweep table."""
from __future__ import annotations

import json
import re

import pytest

from rstitch.results.measurement import CONTENTION_ADVICE, contention_notes
from rstitch.results.metrics import COMPARISON_KEYS, compare_with_baseline, self_comparison, speedups_against, summarize_samples
from rstitch.results.summary import SPEEDUP_LEGEND, format_table, speedup_legend


def sample(problem: str, wall_s: float, cpu_s: float, estimate_s: float | None, tokens: int = 10) -> dict:
    return {"id": problem, "sample_index": 0, "correct": True, "latency_s": wall_s, "tokens": tokens,
            "tokens_slm": 0, "tokens_llm": tokens, "discarded_tokens": 0, "switches": 0, "flops": 1.0,
            "finished_by_eos": True, "cost": {m: {"forward_time_s": 0.0, "forward_calls": 1} for m in ("slm", "llm")},
            "latency_estimate_s": estimate_s,
            "measurement": {"threads": 1, "device": "cpu", "cpus": 2, "load_1m": 1.0, "cpu_s": cpu_s,
                            "cpu_clock": "thread", "cpu_per_wall": cpu_s / wall_s}}


def test_the_estimated_speedup_is_the_ratio_of_the_estimates():
    # A loaded sitting: wall clock and CPU time grew by other jobs, the estimates (forwards x fitted costs) did not.
    baseline = {"latency_s": 3.0, "latency_cpu_s": 1.2, "latency_estimate_s": 1.0, "tokens_per_s": 10.0}
    run = {"latency_s": 0.5, "latency_cpu_s": 0.4, "latency_estimate_s": 0.25, "tokens_per_s": 20.0}
    out = speedups_against(run, baseline)
    assert out["speedup_estimate"] == pytest.approx(4.0) and out["speedup_cpu"] == pytest.approx(3.0)
    assert out["speedup"] == pytest.approx(6.0) and out["speedup_tokens_per_s"] == pytest.approx(2.0)
    assert speedups_against({**run, "latency_estimate_s": None}, baseline)["speedup_estimate"] is None  # no latency_dir
    assert {"speedup_estimate", "speedup_estimate_ci"} <= set(COMPARISON_KEYS)
    assert self_comparison({"latency_estimate_s": 1.0})["speedup_estimate_ci"] == [1.0, 1.0]
    assert self_comparison({"latency_estimate_s": None})["speedup_estimate"] is None


def test_the_paired_comparison_gives_the_estimated_speedup_an_interval(tmp_path):
    base_rows = [sample(p, 3.0, 1.5, 1.0 + i / 10) for i, p in enumerate("abcd")]
    run_rows = [sample(p, 0.9, 0.6, 0.4 + i / 20) for i, p in enumerate("abcd")]
    base_dir = tmp_path / "llm_only" / "x"
    base_dir.mkdir(parents=True)
    (base_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base_rows))
    key = {"k": 1}
    (base_dir / "summary.json").write_text(json.dumps({"method": "llm_only", "comparison_key": key, **summarize_samples(base_rows)}))
    out = compare_with_baseline({"method": "rstitch", "comparison_key": key, **summarize_samples(run_rows)}, run_rows, tmp_path)
    assert out["speedup_estimate"] == pytest.approx(1.15 / 0.475)
    low, high = out["speedup_estimate_ci"]
    assert low < out["speedup_estimate"] < high  # the estimates vary by problem: a real interval
    assert out["speedup_cpu_ci"] == pytest.approx([2.5, 2.5])  # every CPU time alike: a point
    without = [{**r, "latency_estimate_s": None} for r in run_rows]
    assert compare_with_baseline({"method": "rstitch", "comparison_key": key, **summarize_samples(without)},
                                 without, tmp_path)["speedup_estimate_ci"] is None


def test_the_console_table_leads_with_the_estimated_speedup_and_says_why():
    summary = {"method": "rstitch", "speedup": 6.0, "speedup_cpu": 2.5, "speedup_estimate": 2.2,
               "speedup_estimate_ci": [2.0, 2.4]}
    header, row = format_table(summary).splitlines()
    cells = dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip())))
    assert header.index("est_speedup") < header.index("cpu_speedup") < header.index("wall_speedup")
    assert cells["est_speedup [95% CI]"] == "2.20 [2.00, 2.40]" and cells["cpu_speedup [95% CI]"] == "2.50"
    assert speedup_legend(summary) == [SPEEDUP_LEGEND] and "do not move it" in SPEEDUP_LEGEND
    assert speedup_legend({"method": "rstitch", "speedup": 6.0}) == []  # no latency model: nothing to explain


def test_the_contention_flag_points_to_the_estimated_speedup_on_a_cpu():
    flagged = {"method": "rstitch", "run_tag": "tau=0.02_ab", "contention": "load average 5.7 on 2 CPUs",
               "speedup_cpu": 2.31, "speedup_estimate": 2.9, "latency_cpu_s": 0.2}
    assert contention_notes([flagged])[0] == (
        "! rstitch tau=0.02_ab: latency measured under contention (load average 5.7 on 2 CPUs); its estimated speedup "
        "2.90x (forwards counted at fitted costs) holds, its wall-clock one does not")
    assert "est_speedup" in CONTENTION_ADVICE and "CPU-time speedup" in CONTENTION_ADVICE
    gpu = {**flagged, "speedup_cpu": None, "latency_cpu_s": None}  # a GPU's figure stays wall clock
    assert contention_notes([gpu])[0].endswith("(load average 5.7 on 2 CPUs)")


def test_the_sweep_table_carries_the_legend_and_the_wandb_points_the_speedups(tmp_path):
    from rstitch.logging.sweep import POINT_COLUMNS, sweep_table

    run_dir = tmp_path / "rstitch" / "tau=0.02"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"method": "rstitch", "speedup": 2.0, "speedup_estimate": 2.4}))
    lines = sweep_table([run_dir], tmp_path).splitlines()
    assert lines[2] == SPEEDUP_LEGEND and "2.40" in lines[1]
    assert {"speedup_cpu", "speedup_estimate"} <= set(POINT_COLUMNS)


def test_the_report_names_the_estimated_speedup_of_a_contended_run():
    import pandas as pd

    from rstitch.analysis.report import contention_text

    nan = float("nan")
    runs = pd.DataFrame([
        {"method": "rstitch", "setting": "tau=0.02", "group": "g", "contention": "load average 5.7 on 2 CPUs",
         "speedup_estimate": 3.2, "speedup_cpu": 2.9, "latency_cpu_s": 0.1},
        {"method": "rsd", "setting": "", "group": "g", "contention": "load average 5.7 on 2 CPUs",
         "speedup_estimate": nan, "speedup_cpu": nan, "latency_cpu_s": nan}])  # no figure holds: none named
    text = contention_text(runs)
    assert text.startswith("Latency measured under contention in 2 of 2 runs: rstitch tau=0.02 (g): load average 5.7 "
                           "on 2 CPUs; its estimated speedup 3.20x (forwards counted at fitted costs) holds, its "
                           "wall-clock one does not; rsd  (g): load average 5.7 on 2 CPUs. On a CPU, read the estimated")


def test_bench_contention_prints_each_speedup_and_its_loaded_over_quiet_ratio(tmp_path, capsys):
    """scripts/bench_contention.py's reading of two sittings' summaries (the sweep itself is a benchmark, not a test)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_contention", Path(__file__).resolve().parents[2] / "scripts" / "bench_contention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # defines functions only; main() runs under __main__
    for sitting, (wall, cpu, estimate) in {"quiet": (3.0, 3.0, 2.5), "loaded": (1.5, 2.4, 2.45)}.items():
        run_dir = tmp_path / sitting / "testbed" / "testbed" / "rstitch" / "tau=0.02_x"
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "config": {"method": {"tau": 0.02}}, "speedup": wall, "speedup_cpu": cpu, "speedup_estimate": estimate,
            "measurement": {"cpu_per_wall": 0.5}}))
    results = {name: {"speedups": bench.read_speedups(tmp_path / name)} for name in ("quiet", "loaded")}
    bench.print_table(results, ("0.02",))
    header, row = capsys.readouterr().out.splitlines()
    cells = dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip())))
    assert cells["quiet estimate"] == "2.50" and cells["loaded cpu"] == "2.40"
    assert (cells["loaded/quiet wall"], cells["loaded/quiet cpu"], cells["loaded/quiet estimate"]) == ("0.50", "0.80", "0.98")
