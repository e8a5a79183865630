"""The sweep summary's W&B chart of accuracy vs latency with 95% error bars: W&B's presets draw none, so each
interval is a two-point segment of the line preset (the same line in whichever order the chart sorts points)."""
from __future__ import annotations

from typing import Any

import pandas as pd

INTERVAL_ENDS = ("accuracy_ci_low", "accuracy_ci_high", "latency_ci_low", "latency_ci_high")


def interval_segments(points: pd.DataFrame) -> pd.DataFrame:
    """Two rows per interval of each run (accuracy vertical, latency horizontal); runs lacking one left out."""
    rows: list[tuple[str, float, float]] = []
    known = points.dropna(subset=["accuracy", "latency_s", *INTERVAL_ENDS]) if set(INTERVAL_ENDS) <= set(points) else points.iloc[:0]
    for run in known.itertuples():
        name = " ".join(str(part) for part in (run.method, run.setting) if part)
        rows += [(f"{name}: accuracy 95% CI", run.latency_s, run.accuracy_ci_low),
                 (f"{name}: accuracy 95% CI", run.latency_s, run.accuracy_ci_high),
                 (f"{name}: latency 95% CI", run.latency_ci_low, run.accuracy),
                 (f"{name}: latency 95% CI", run.latency_ci_high, run.accuracy)]
    return pd.DataFrame(rows, columns=["interval", "latency_s", "accuracy"])


def accuracy_latency_error_bars(points: pd.DataFrame) -> Any:
    """The chart to log (a `wandb.plot` custom chart over `interval_segments`)."""
    import wandb

    table = wandb.Table(dataframe=interval_segments(points))
    return wandb.plot.line(table, "latency_s", "accuracy", stroke="interval", title="accuracy vs latency (s): 95% intervals")
