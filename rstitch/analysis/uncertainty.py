"""Error bars for the runs frame, from the samples of each run: accuracy's standard error and
interval, latency's interval, the paired comparison with the comparison's LLM-only run (speedup
split with bootstrap intervals, accuracy difference) and how often each run stays on the Pareto
frontier when the problems are resampled. The estimators are those of the summaries
(`rstitch.results.uncertainty`); docs/analysis.md says which is which."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from rstitch.methods import baseline_method
from rstitch.results.table import pareto_mask
from rstitch.results.uncertainty import (
    N_BOOT,
    SEED,
    ProblemMeans,
    accuracy_estimate,
    bootstrap_indices,
    paired_accuracy_difference,
    percentile_interval,
    problem_means,
    shared_problems,
    speedup_intervals,
)

# Intervals as two columns each (`<name>_low`, `<name>_high`); summary.json holds them as [low, high].
INTERVALS = ("accuracy_ci", "latency_ci", "speedup_ci", "speedup_cpu_ci", "speedup_estimate_ci", "token_ratio_ci", "per_token_latency_ratio_ci")
ESTIMATES = ("accuracy_se", "token_ratio", "token_reduction", "per_token_latency_ratio", "accuracy_diff",
             "accuracy_diff_se", "accuracy_diff_p")
INTERVAL_COLUMNS = (*ESTIMATES, *(f"{name}_{end}" for name in INTERVALS for end in ("low", "high")))


def recorded_intervals(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The interval columns as a run recorded them: from summary.json (`[low, high]` lists) or a
    W&B summary (`_low` / `_high` scalars, as `WandbLogger` logs them); None where absent."""
    row: dict[str, Any] = {key: summary.get(key) for key in ESTIMATES}
    for name in INTERVALS:
        pair = summary.get(name)
        low, high = (pair if isinstance(pair, (list, tuple)) and len(pair) == 2
                     else (summary.get(f"{name}_low"), summary.get(f"{name}_high")))
        row.update({f"{name}_low": low, f"{name}_high": high})
    return row


def _means(samples: pd.DataFrame, column: str) -> ProblemMeans:
    """Per-problem means of a sample column; a missing count (correct, tokens) is 0, as in the summaries."""
    values = samples[column].astype(float)
    return problem_means(values.fillna(0.0) if column in ("correct", "tokens") else values, samples["id"])


def _positive(value: Any) -> bool:
    return value is not None and not pd.isna(value) and float(value) > 0


def _latency_statistic(latency: str) -> tuple[str, Callable[[np.ndarray], np.ndarray]]:
    """The per-sample column behind a runs-frame latency column, and the statistic over
    resampled problems (rows of an array)."""
    if latency == "latency_median_s":
        return "latency_s", lambda values: np.median(values, axis=-1)
    return latency, lambda values: values.mean(axis=-1)


def with_intervals(runs: pd.DataFrame, samples: pd.DataFrame, latency: str = "latency_s",
                   n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """`runs` with INTERVAL_COLUMNS computed from `samples` (`load_samples(runs)`), and
    `frontier_share`: the share of bootstrap resamples of the problems in which the run is on its
    comparison's Pareto frontier. Runs without samples keep what they recorded."""
    out = runs.copy()
    for column in INTERVAL_COLUMNS:
        if column not in out:
            out[column] = np.nan
    by_run = {run_dir: block for run_dir, block in samples.groupby("run_dir", sort=False)}
    baselines = _baseline_runs(runs)
    column, statistic = _latency_statistic(latency)
    for index, run in runs.iterrows():
        mine = by_run.get(run["run_dir"])
        if mine is None or mine.empty:
            continue
        values = _run_intervals(mine, column, statistic, n_boot, seed)
        baseline = baselines.get(run["comparison"])
        if baseline is not None and baseline["run_dir"] in by_run:
            values.update(_paired_columns(run, baseline, mine, by_run[baseline["run_dir"]], n_boot, seed))
        for key, value in values.items():
            out.at[index, key] = np.nan if value is None else value
    out["frontier_share"] = frontier_stability(runs, by_run, latency, n_boot, seed)
    return out


def _baseline_runs(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """Per comparison, the LLM-only run speedups are measured against (the fastest, as in `load_runs`)."""
    base = runs[runs["method"] == baseline_method()].sort_values("latency_s")
    return {comparison: block.iloc[0] for comparison, block in base.groupby("comparison", sort=False)}


def _run_intervals(mine: pd.DataFrame, latency_column: str, statistic: Callable[[np.ndarray], np.ndarray],
                   n_boot: int, seed: int) -> dict[str, Any]:
    accuracy = accuracy_estimate(mine["correct"].astype(float).to_numpy(), list(mine["id"]))
    values: dict[str, Any] = {"accuracy_se": accuracy.se, "accuracy_ci_low": accuracy.low, "accuracy_ci_high": accuracy.high}
    per_problem = _means(mine, latency_column).means
    if len(per_problem) > 1 and np.isfinite(per_problem).all():
        interval = percentile_interval(statistic(per_problem[bootstrap_indices(len(per_problem), n_boot, seed)]))
        if interval is not None:
            values.update(latency_ci_low=interval[0], latency_ci_high=interval[1])
    return values


def _paired_columns(run: pd.Series, baseline: pd.Series, mine: pd.DataFrame, theirs: pd.DataFrame,
                    n_boot: int, seed: int) -> dict[str, Any]:
    """The speedup split (point estimates from the runs' means, as the speedup column) with its
    paired bootstrap intervals, and the paired accuracy difference."""
    values: dict[str, Any] = {}
    if _positive(run["tokens"]) and _positive(baseline["tokens"]):
        ratio = float(run["tokens"]) / float(baseline["tokens"])
        values.update(token_ratio=ratio, token_reduction=1.0 - ratio,
                      per_token_latency_ratio=None if pd.isna(run["speedup"]) else float(run["speedup"]) * ratio)
    diff = paired_accuracy_difference(_means(mine, "correct"), _means(theirs, "correct"))
    values.update(accuracy_diff=diff.difference, accuracy_diff_se=diff.se, accuracy_diff_p=diff.p_value)
    intervals = speedup_intervals({"run": _means(mine, "latency_s"), "baseline": _means(theirs, "latency_s")},
                                  {"run": _means(mine, "tokens"), "baseline": _means(theirs, "tokens")}, n_boot, seed)
    for name, interval in (("speedup_ci", intervals.speedup), ("token_ratio_ci", intervals.token_ratio),
                           ("per_token_latency_ratio_ci", intervals.per_token_latency_ratio)):
        if interval is not None:
            values.update({f"{name}_low": interval[0], f"{name}_high": interval[1]})
    return values


def frontier_stability(runs: pd.DataFrame, by_run: Mapping[str, pd.DataFrame], latency: str = "latency_s",
                       n_boot: int = N_BOOT, seed: int = SEED) -> pd.Series:
    """Per run, the share of bootstrap resamples of its comparison's problems (the same resampled
    problems for every run of the comparison: paired) in which it is on the Pareto frontier of
    (accuracy, latency) over all runs of the comparison. NaN for runs without samples or with
    fewer than two problems shared by the comparison's runs."""
    share = pd.Series(np.nan, index=runs.index)
    column, statistic = _latency_statistic(latency)
    for _, group in runs.groupby("comparison", sort=False):
        members = [i for i in group.index if runs.at[i, "run_dir"] in by_run]
        if not members:
            continue
        blocks = [by_run[runs.at[i, "run_dir"]] for i in members]
        correct = [_means(b, "correct") for b in blocks]
        latencies = [_means(b, column) for b in blocks]
        ids = shared_problems(*correct)
        if len(ids) < 2:
            continue
        rows = bootstrap_indices(len(ids), n_boot, seed)
        accuracy = np.stack([c.take(ids)[rows].mean(axis=1) for c in correct], axis=1)  # [resample, run]
        latency_values = np.stack([statistic(lat.take(ids)[rows]) for lat in latencies], axis=1)
        share.loc[members] = pareto_mask(accuracy, latency_values).mean(axis=0)
    return share
