"""Error bars and the contention flag in the analysis figures (rstitch.analysis.plots), read from
the matplotlib artists of hand-made runs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from rstitch.analysis.collect import run_row, runs_frame
from rstitch.analysis.plots import accuracy_acceptance_figure, leading_speedup, speedup_figure

from test_analysis import config


def run(method: str, accuracy: float, latency: float, cpu: float | None = None, contention: str | None = None,
        **params) -> dict:
    """One run as a runs-frame row, with the intervals a summary records (accuracy +/- 0.05,
    wall-clock speedup interval +/- 0.1, CPU-time one +/- 0.2)."""
    summary = {"accuracy": accuracy, "latency_s": latency, "latency_cpu_s": cpu, "tokens": 100.0, "tokens_llm": 50.0,
               "tokens_slm": 50.0, "llm_token_share": 0.5, "contention": contention,
               "accuracy_ci": [accuracy - 0.05, accuracy + 0.05], "acceptance_rate": 0.6}
    return run_row(summary, config(method, **params), run_dir=f"{method}-{params}")


def with_speedup_intervals(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs.copy()
    runs["speedup_ci_low"], runs["speedup_ci_high"] = runs["speedup"] - 0.1, runs["speedup"] + 0.1
    runs["speedup_cpu_ci_low"], runs["speedup_cpu_ci_high"] = runs["speedup_cpu"] - 0.2, runs["speedup_cpu"] + 0.2
    return runs


def error_bars(figure) -> list[ErrorbarContainer]:
    return [c for c in figure.axes[0].containers if isinstance(c, ErrorbarContainer)]


def segment_ends(container: ErrorbarContainer, vertical: bool) -> list[float]:
    """low, high of each bar of an errorbar container (its y extent if vertical, else its x), in
    the order of the bars' lows."""
    lines = container.lines[2]
    collection = lines[-1] if vertical else lines[0]
    axis = 1 if vertical else 0
    ends = sorted((float(min(s[:, axis])), float(max(s[:, axis]))) for s in collection.get_segments())
    return [end for pair in ends for end in pair]


def test_accuracy_vs_acceptance_shows_each_runs_accuracy_interval():
    runs = runs_frame([run("rsd", 0.8, 2.0, delta=0.5), run("rsd", 0.6, 1.0, delta=0.9)])
    figure = accuracy_acceptance_figure(runs, runs["group"].iloc[0])
    [bars] = error_bars(figure)  # one method with an acceptance rate: rsd
    assert segment_ends(bars, vertical=True) == pytest.approx([55.0, 65.0, 75.0, 85.0])
    low, high = figure.axes[0].get_ylim()
    assert low <= 55.0 and high >= 85.0  # the axis holds the intervals too


def test_accuracy_vs_acceptance_without_intervals_draws_none():
    runs = runs_frame([run("rsd", 0.8, 2.0, delta=0.5)]).drop(columns=["accuracy_ci_low", "accuracy_ci_high"])
    assert error_bars(accuracy_acceptance_figure(runs, runs["group"].iloc[0])) == []


def test_speedup_figure_leads_with_the_cpu_time_speedup_on_a_cpu_and_flags_contention():
    rows = [run("llm_only", 0.9, 4.0, cpu=2.0), run("rstitch", 0.8, 2.0, cpu=0.5, tau=0.01),
            run("rstitch", 0.7, 1.0, cpu=0.8, contention="load 7.0 on 2 CPUs", tau=0.05)]
    runs = with_speedup_intervals(runs_frame(rows))
    assert leading_speedup(runs) == "speedup_cpu"
    figure = speedup_figure(runs, runs["group"].iloc[0])
    ax = figure.axes[0]
    assert "CPU time" in ax.get_xlabel() and [t.get_text() for t in ax.get_legend().get_texts()] == ["wall-clock speedup"]
    bars = error_bars(figure)
    assert [end for b in bars for end in segment_ends(b, vertical=False)] == pytest.approx([3.8, 4.2, 2.3, 2.7])  # CPU: 2/0.5, 2/0.8
    wall = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert sorted(float(line.get_xdata()[0]) for line in wall) == pytest.approx([2.0, 4.0])  # 4/2, 4/1
    flagged = [t for t in ax.texts if t.get_text() == "contended"]
    assert len(flagged) == 1 and flagged[0].xy[0] == pytest.approx(2.5)  # at the contended run's point only
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rstitch tau=0.01", "rstitch tau=0.05"]


def test_speedup_figure_on_a_gpu_plots_the_wall_clock_speedup():
    runs = with_speedup_intervals(runs_frame([run("llm_only", 0.9, 4.0), run("specdec", 0.9, 2.0)]))
    assert runs["speedup_cpu"].isna().all() and leading_speedup(runs) == "speedup"
    figure = speedup_figure(runs, runs["group"].iloc[0])
    assert "wall clock" in figure.axes[0].get_xlabel() and "CPU" not in figure.axes[0].get_xlabel()
    [bars] = error_bars(figure)
    assert segment_ends(bars, vertical=False) == pytest.approx([1.9, 2.1])
    assert not [line for line in figure.axes[0].get_lines() if line.get_marker() == "x"] and figure.axes[0].get_legend() is None
    assert np.isclose(float(figure.axes[0].get_lines()[0].get_xdata()[0]), 2.0)


def test_speedup_figure_leads_with_the_latency_models_estimate_where_the_runs_have_one():
    rows = [run("llm_only", 0.9, 4.0, cpu=2.0), run("rstitch", 0.8, 2.0, cpu=0.5, tau=0.01)]
    for row, estimate in zip(rows, (3.0, 1.0)):
        row["latency_estimate_s"] = estimate
    runs = with_speedup_intervals(runs_frame(rows))
    runs["speedup_estimate_ci_low"], runs["speedup_estimate_ci_high"] = runs["speedup_estimate"] - 0.3, runs["speedup_estimate"] + 0.3
    assert leading_speedup(runs) == "speedup_estimate"  # as the console table (results/summary.py) leads
    figure = speedup_figure(runs, runs["group"].iloc[0])
    assert "latency model's estimate" in figure.axes[0].get_xlabel()
    [bars] = error_bars(figure)
    assert segment_ends(bars, vertical=False) == pytest.approx([2.7, 3.3])  # 3 / 1
