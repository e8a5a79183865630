"""The sweep summary's native W&B chart of accuracy vs latency draws each run's 95% intervals
(rstitch.logging.wandb_charts), as segments of the built-in line preset."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import test_uncertainty as hand

from rstitch.logging.wandb_charts import accuracy_latency_error_bars, interval_segments

import test_analysis

analysis_sweep = test_analysis.analysis_sweep  # the sweep fixture, shared with test_analysis.py


def points() -> pd.DataFrame:
    return pd.DataFrame([
        {"method": "llm_only", "setting": "", "accuracy": 0.9, "latency_s": 4.0, "accuracy_ci_low": 0.8,
         "accuracy_ci_high": 0.95, "latency_ci_low": 3.5, "latency_ci_high": 4.6},
        {"method": "rstitch", "setting": "tau=0.01", "accuracy": 0.7, "latency_s": 2.0, "accuracy_ci_low": 0.6,
         "accuracy_ci_high": 0.8, "latency_ci_low": 1.8, "latency_ci_high": 2.3},
        {"method": "slm_only", "setting": "", "accuracy": 0.4, "latency_s": 0.5, "accuracy_ci_low": None,
         "accuracy_ci_high": None, "latency_ci_low": 0.4, "latency_ci_high": 0.6},  # no interval: no bars
    ])


def test_each_run_gets_a_vertical_accuracy_and_a_horizontal_latency_segment_through_its_point():
    segments = interval_segments(points())
    by_stroke = {name: block[["latency_s", "accuracy"]].to_numpy().tolist() for name, block in segments.groupby("interval")}
    assert by_stroke == {
        "llm_only: accuracy 95% CI": [[4.0, 0.8], [4.0, 0.95]], "llm_only: latency 95% CI": [[3.5, 0.9], [4.6, 0.9]],
        "rstitch tau=0.01: accuracy 95% CI": [[2.0, 0.6], [2.0, 0.8]],
        "rstitch tau=0.01: latency 95% CI": [[1.8, 0.7], [2.3, 0.7]],
    }


def test_a_frame_without_interval_columns_gives_no_segments():
    assert interval_segments(points().drop(columns=["latency_ci_low", "latency_ci_high"])).empty


def test_the_chart_is_the_line_preset_over_the_segments():
    chart = accuracy_latency_error_bars(points())
    assert chart.spec.spec_name == "wandb/line/v0"
    assert chart.spec.fields == {"x": "latency_s", "y": "accuracy", "stroke": "interval"}
    assert chart.table.columns == ["interval", "latency_s", "accuracy"] and len(chart.table.data) == 8
    assert chart.table.data[0][1:] == pytest.approx([4.0, 0.8])


@pytest.mark.slow
def test_the_sweep_summary_logs_the_error_bar_chart_of_its_points(analysis_sweep, tmp_path):
    """An offline W&B sweep summary over the analysis sweep: the chart's table holds two segments per run."""
    from rstitch.analysis import find_run_dirs
    from rstitch.logging import WandbLogger
    from rstitch.logging.sweep import log_sweep_summary

    run_dirs = sorted(find_run_dirs(analysis_sweep))
    logger = WandbLogger(project="charts", mode="offline", dir=str(tmp_path))
    assert log_sweep_summary(run_dirs, logger, "sweep") is not None
    [table_file] = tmp_path.glob("wandb/offline-run-*/files/media/table/sweep/accuracy_vs_latency_error_bars_table_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["interval", "latency_s", "accuracy"]
    strokes = {row[0] for row in table["data"]}
    assert len(table["data"]) == 4 * len(run_dirs) and len(strokes) == 2 * len(run_dirs)
    assert all(0.0 <= row[2] <= 1.0 and row[1] > 0 for row in table["data"])


def test_a_run_logs_its_three_speedups_as_its_pareto_point_estimate_first():
    from rstitch.logging import PARETO_KEYS, wandb_summary

    summary = {"method": "rstitch", "latency_estimate_s": 0.4, "speedup": 2.0, "speedup_cpu": 2.2, "speedup_estimate": 2.5,
               "speedup_estimate_ci": [2.3, 2.7], "accuracy": 0.9}
    logged = list(wandb_summary(summary))
    assert logged[:4] == ["accuracy", "speedup_estimate", "speedup_cpu", "speedup"]
    assert {"speedup_estimate_ci_low", "speedup_estimate_ci_high"} <= set(logged)
    assert PARETO_KEYS.index("speedup_estimate") < PARETO_KEYS.index("speedup_cpu") < PARETO_KEYS.index("speedup")


def test_the_sweep_table_carries_each_speedups_interval(tmp_path):
    """An offline W&B sweep summary over two hand-written CPU runs: the points table holds the
    CPU-time and estimated speedups with their paired intervals, as it holds the wall one's."""
    from rstitch.logging import WandbLogger
    from rstitch.logging.sweep import log_sweep_summary
    from rstitch.results.summary import summarize_run

    def sample(i: int, latency: float, tokens: int) -> dict:
        return {**hand._sample(i, i % 2 == 0, latency, tokens), "latency_estimate_s": latency * 0.8,
                "measurement": {"device": "cpu", "cpu_s": latency * 0.9}}

    runs = {"llm_only": [sample(i, 1.0 + 0.1 * i, 100) for i in range(6)],
            "rstitch": [sample(i, 0.4 + 0.03 * i, 60) for i in range(6)]}
    for name, samples in runs.items():
        method = hand._method(name, "target" if name == "llm_only" else None)
        hand._write_run(tmp_path, name, summarize_run(hand._config(name), method, samples, tmp_path), samples)
    logger = WandbLogger(project="charts", mode="offline", dir=str(tmp_path / "wb"))
    assert log_sweep_summary([tmp_path / name for name in runs], logger, "sweep") is not None
    [table_file] = (tmp_path / "wb").glob("wandb/offline-run-*/files/media/table/sweep/points_*.table.json")
    table = json.loads(table_file.read_text())
    stitch = next(dict(zip(table["columns"], row)) for row in table["data"] if row[table["columns"].index("method")] == "rstitch")
    for name in ("speedup", "speedup_cpu", "speedup_estimate"):
        assert stitch[f"{name}_ci_low"] <= stitch[name] <= stitch[f"{name}_ci_high"], name
