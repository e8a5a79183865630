"""Pareto frontiers on (latency, accuracy), and speedups at matched accuracy: as Arbitrage compares curves,
the ratio of the latencies two methods need to reach an accuracy both reach."""
from __future__ import annotations

import itertools

import pandas as pd

from rstitch.analysis.collect import BASELINE, is_baseline
from rstitch.errors import ConfigError
from rstitch.results.table import pareto_front

LATENCY_COLUMNS = ("latency_s", "latency_estimate_s", "latency_median_s")
# Accuracies are means over samples; two that differ by less than this are the same level.
ACCURACY_TOLERANCE = 1e-9


def check_latency_column(runs: pd.DataFrame, latency: str) -> None:
    if latency not in LATENCY_COLUMNS:
        raise ConfigError(f"unknown latency column '{latency}'; valid: {', '.join(LATENCY_COLUMNS)}")
    if runs[latency].isna().any():
        missing = runs.loc[runs[latency].isna(), "run_dir"].iloc[0]
        raise ConfigError(f"runs without {latency} (e.g. {missing}); choose another latency column")


def mark_frontier(runs: pd.DataFrame, latency: str = "latency_s") -> pd.DataFrame:
    """`runs` with `on_frontier`: no run of its comparison (all methods) is as accurate and faster, or better."""
    check_latency_column(runs, latency)
    marked = runs.copy()
    marked["on_frontier"] = False
    for _, group in runs.groupby("comparison"):
        marked.loc[pareto_front(group, latency=latency).index, "on_frontier"] = True
    return marked


def latency_to_reach(points: pd.DataFrame, accuracy: float, latency: str = "latency_s") -> float:
    """The lowest latency among `points` whose accuracy is at least `accuracy` (inf if none)."""
    reached = points[points["accuracy"] >= accuracy - ACCURACY_TOLERANCE]
    return float(reached[latency].min()) if len(reached) else float("inf")


def speedup_at_matched_accuracy(runs: pd.DataFrame, method: str, baseline: str, latency: str = "latency_s") -> pd.DataFrame:
    """Per comparison holding both methods, one row per accuracy level both reach: the latency each needs
    (a measured run's: no interpolation between runs) and `speedup` = baseline latency / method latency."""
    check_latency_column(runs, latency)
    rows = []
    for comparison, group in runs.groupby("comparison", sort=False):
        ours, theirs = group[group["method"] == method], group[group["method"] == baseline]
        if ours.empty or theirs.empty:
            continue
        top = min(ours["accuracy"].max(), theirs["accuracy"].max())
        levels = sorted({a for a in pd.concat([ours["accuracy"], theirs["accuracy"]]) if a <= top + ACCURACY_TOLERANCE})
        for level in levels:
            lat_ours, lat_theirs = latency_to_reach(ours, level, latency), latency_to_reach(theirs, level, latency)
            rows.append({"group": group["group"].iloc[0], "comparison": comparison, "method": method,
                         "baseline": baseline, "accuracy": level, "latency": lat_ours,
                         "baseline_latency": lat_theirs, "speedup": lat_theirs / lat_ours})
    return pd.DataFrame(rows, columns=["group", "comparison", "method", "baseline", "accuracy", "latency",
                                       "baseline_latency", "speedup"])


def curve_pairs(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """Every method against LLM-only, and every two methods that both have a curve (2+ runs) in some group."""
    present = list(dict.fromkeys(runs["method"]))
    pairs = [(m, BASELINE) for m in present if not is_baseline(m) and BASELINE in present]
    curves = runs.groupby(["comparison", "method"]).size()
    for _, counts in curves[curves > 1].groupby(level="comparison"):
        pairs += [p for p in itertools.permutations(counts.index.get_level_values("method"), 2) if p not in pairs]
    return pairs


def matched_speedup_summary(runs: pd.DataFrame, pairs: list[tuple[str, str]] | None = None,
                            latency: str = "latency_s") -> pd.DataFrame:
    """Per group and (method, baseline) of `pairs` (default `curve_pairs`): the speedup at the highest accuracy
    both reach, and the largest over all matched levels (`max_speedup` at `max_speedup_accuracy`)."""
    rows = []
    for method, baseline in pairs if pairs is not None else curve_pairs(runs):
        if method == baseline:
            raise ConfigError(f"cannot compare method '{method}' with itself")
        curve = speedup_at_matched_accuracy(runs, method, baseline, latency)
        for (group, comparison), levels in curve.groupby(["group", "comparison"], sort=False):
            top = levels.loc[levels["accuracy"].idxmax()]
            best = levels.loc[levels["speedup"].idxmax()]
            rows.append({"group": group, "comparison": comparison, "method": method, "baseline": baseline,
                         "top_accuracy": top["accuracy"], "speedup_at_top": top["speedup"],
                         "max_speedup": best["speedup"], "max_speedup_accuracy": best["accuracy"]})
    return pd.DataFrame(rows, columns=["group", "comparison", "method", "baseline", "top_accuracy", "speedup_at_top",
                                       "max_speedup", "max_speedup_accuracy"])
