"""How uncertain a run's numbers are, problems the unit of resampling (docs/analysis.md, "Uncertainty"
names each estimator and why); ranking quality (ROC-AUC, Spearman's rho) of PRMs, judges and routers.
No scipy: summaries are written at run time, where it is not installed (tests check against it)."""
from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from rstitch.methods import baseline_method
from rstitch.results.table import pareto_order_and_mask

LEVEL = 0.95  # every interval's coverage
N_BOOT = 2000  # bootstrap resamples per interval
SEED = 0  # intervals are seeded: the same runs give the same intervals, run after run


def z_value(level: float = LEVEL) -> float:
    """The two-sided standard-normal quantile of `level` (1.96 at 0.95)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


@dataclass(frozen=True)
class ProblemMeans:
    """Per problem (sorted by id), the mean of a per-sample value over its samples, and how many."""

    ids: tuple[str, ...]
    means: np.ndarray
    counts: np.ndarray

    def take(self, ids: Sequence[str]) -> np.ndarray:
        index = {problem: i for i, problem in enumerate(self.ids)}
        return self.means[[index[problem] for problem in ids]]


def problem_means(values: Iterable[float], problems: Iterable[Hashable]) -> ProblemMeans:
    sums: defaultdict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    for value, problem in zip(values, problems):
        sums[str(problem)] += float(value)
        counts[str(problem)] += 1
    ids = tuple(sorted(sums))
    return ProblemMeans(ids, np.array([sums[i] / counts[i] for i in ids]), np.array([counts[i] for i in ids], dtype=float))


def clustered_se(values: Sequence[float] | np.ndarray, problems: Sequence[Hashable]) -> float | None:
    """CR0 sandwich: sqrt(sum over problems of (sum of its residuals)^2) / N; None under two problems."""
    data = np.asarray(values, dtype=float)
    grouped = problem_means(data, problems)
    if len(grouped.ids) < 2:
        return None
    residual_sums = grouped.counts * (grouped.means - data.mean())
    return float(math.sqrt(float(np.sum(residual_sums**2))) / len(data))


@dataclass(frozen=True)
class AccuracyEstimate:
    accuracy: float
    se: float | None
    low: float | None
    high: float | None
    effective_n: float | None


def wilson_interval(p: float, n: float, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval for a proportion p over n trials."""
    z = z_value(level)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if p == 0 else low), (1.0 if p == 1 else high)  # exact at the ends, not 1e-17 away


def accuracy_estimate(correct: Sequence[float] | np.ndarray, problems: Sequence[Hashable], level: float = LEVEL) -> AccuracyEstimate:
    """Mean, clustered se, Wilson interval at the effective size p(1-p) / se^2 (<= N; the problems if all agree)."""
    data = np.asarray(correct, dtype=float)
    p = float(data.mean())
    se = clustered_se(data, problems)
    if se is None:
        return AccuracyEstimate(p, None, None, None, None)
    if p in (0.0, 1.0):
        effective = float(len(problem_means(data, problems).ids))
    else:
        effective = len(data) if se == 0 else min(float(len(data)), p * (1 - p) / se**2)
    low, high = wilson_interval(p, effective, level)
    return AccuracyEstimate(p, se, low, high, effective)


def shared_problems(*runs: ProblemMeans) -> list[str]:
    """The problem ids every run holds, sorted (the order resampling indexes)."""
    return sorted(set(runs[0].ids).intersection(*(r.ids for r in runs[1:])))


def mcnemar_exact_p(only_first: int, only_second: int) -> float:
    """Two-sided binomial p of the discordant pairs (= scipy.stats.binomtest(b, b + c).pvalue)."""
    n = only_first + only_second
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_first, only_second) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedDifference:
    difference: float  # mean over shared problems of (run - baseline) accuracy
    se: float | None  # paired standard error: from the per-problem differences
    p_value: float | None
    test: str | None  # "mcnemar_exact" (one sample per problem) or "z_clustered"
    n_problems: int


def paired_accuracy_difference(run: ProblemMeans, baseline: ProblemMeans) -> PairedDifference:
    """Over shared problems: mean and se of the per-problem differences; McNemar's exact p (one 0/1 sample each) or a z test's."""
    ids = shared_problems(run, baseline)
    if not ids:
        return PairedDifference(float("nan"), None, None, None, 0)
    ours, theirs = run.take(ids), baseline.take(ids)
    d = ours - theirs
    mean = float(d.mean())
    if len(ids) < 2:
        return PairedDifference(mean, None, None, None, len(ids))
    se = float(math.sqrt(float(np.sum((d - mean) ** 2))) / len(ids))
    binary = all(np.isin(x, (0.0, 1.0)).all() for x in (ours, theirs)) and run.counts.max() == 1 == baseline.counts.max()
    if binary:
        return PairedDifference(mean, se, mcnemar_exact_p(int(np.sum(d > 0)), int(np.sum(d < 0))), "mcnemar_exact", len(ids))
    p = (1.0 if mean == 0 else 0.0) if se == 0 else 2 * (1 - NormalDist().cdf(abs(mean) / se))
    return PairedDifference(mean, se, p, "z_clustered", len(ids))


def bootstrap_indices(n_items: int, seed: int = SEED) -> np.ndarray:
    """[N_BOOT, n_items] indices, seeded: every run of a comparison gets the same rows (paired)."""
    return np.random.default_rng(seed).integers(0, n_items, size=(N_BOOT, n_items))


def percentile_interval(values: np.ndarray) -> tuple[float, float] | None:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return None
    low, high = np.quantile(finite, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high)


def bootstrap_interval(values: np.ndarray, statistic: Callable[..., np.ndarray] = np.mean) -> tuple[float, float] | None:
    """Percentile interval of `statistic` (np.mean, np.median) of per-problem `values` under resampling of problems."""
    if len(values) < 2:
        return None
    return percentile_interval(statistic(values[bootstrap_indices(len(values))], axis=-1))


def speedup_split(summary: dict[str, Any], baseline: dict[str, Any], speedup: float | None) -> dict[str, float | None]:
    """From the runs' means: token_ratio (R-Stitch's reduction is 1 - it) and per_token_latency_ratio = speedup x token_ratio."""
    tokens, base_tokens = summary.get("tokens"), baseline.get("tokens")
    if not tokens or not base_tokens:
        return {}
    ratio = tokens / base_tokens
    return {"token_ratio": ratio, "token_reduction": 1.0 - ratio,
            "per_token_latency_ratio": None if speedup is None else speedup * ratio}


@dataclass(frozen=True)
class RatioIntervals:
    """Paired bootstrap intervals of the speedup split: speedup = per_token_latency_ratio / token_ratio."""

    speedup: tuple[float, float] | None
    token_ratio: tuple[float, float] | None
    per_token_latency_ratio: tuple[float, float] | None
    n_problems: int


def speedup_intervals(latency: Mapping[str, ProblemMeans], tokens: Mapping[str, ProblemMeans], seed: int = SEED) -> RatioIntervals:
    """Paired bootstrap intervals ("run" vs "baseline") of the speedup split, which holds in every resample."""
    ids = shared_problems(latency["run"], latency["baseline"], tokens["run"], tokens["baseline"])
    if len(ids) < 2:
        return RatioIntervals(None, None, None, len(ids))
    rows = bootstrap_indices(len(ids), seed)

    def resampled(values: Mapping[str, ProblemMeans], who: str) -> np.ndarray:
        return values[who].take(ids)[rows].mean(axis=1)

    with np.errstate(divide="ignore", invalid="ignore"):
        speedup = resampled(latency, "baseline") / resampled(latency, "run")
        token_ratio = resampled(tokens, "run") / resampled(tokens, "baseline")
        per_token = speedup * token_ratio
    return RatioIntervals(percentile_interval(speedup), percentile_interval(token_ratio), percentile_interval(per_token), len(ids))


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n in input order, tied values sharing their average rank."""
    return pd.Series(values, dtype=float).rank(method="average").tolist()


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """P(a random positive outscores a random negative), ties half (rank-sum form); nan without both classes."""
    n_pos = sum(bool(y) for y in labels)
    n_neg = len(labels) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    rank_sum = sum(rank for rank, y in zip(average_ranks(scores), labels) if y)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson correlation of the average ranks; nan when either side is constant or shorter than two."""
    try:
        return statistics.correlation(average_ranks(a), average_ranks(b))
    except statistics.StatisticsError:
        return float("nan")


def roc_auc_interval(scores: Sequence[float], labels: Sequence[bool], groups: Sequence[Hashable]) -> tuple[float, float]:
    """Percentile bootstrap interval of `roc_auc`, resampling whole groups (the steps of one problem:
    wrong steps cluster in the problems a model gets wrong). One-class resamples are skipped."""
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    members = list(by_group.values())
    rng = random.Random(SEED)
    aucs = []
    for _ in range(N_BOOT):
        rows = [i for _ in members for i in members[rng.randrange(len(members))]]
        auc = roc_auc([scores[i] for i in rows], [labels[i] for i in rows])
        if auc == auc:
            aucs.append(auc)
    if not aucs:
        return float("nan"), float("nan")
    aucs.sort()
    tail = (1 - LEVEL) / 2
    return aucs[int(tail * (len(aucs) - 1))], aucs[int(round((1 - tail) * (len(aucs) - 1)))]


# Intervals as two columns each (`<name>_low`, `<name>_high`); summary.json holds them as [low, high].
INTERVALS = ("accuracy_ci", "latency_ci", "speedup_ci", "speedup_cpu_ci", "speedup_estimate_ci", "token_ratio_ci", "per_token_latency_ratio_ci")
ESTIMATES = ("accuracy_se", "token_ratio", "token_reduction", "per_token_latency_ratio", "accuracy_diff",
             "accuracy_diff_se", "accuracy_diff_p")
INTERVAL_COLUMNS = (*ESTIMATES, *(f"{name}_{end}" for name in INTERVALS for end in ("low", "high")))


def recorded_intervals(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The interval columns from summary.json (`[low, high]`) or a W&B summary (`_low` / `_high`)."""
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


def _known(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _latency_statistic(latency: str) -> tuple[str, Callable[..., np.ndarray]]:
    """The per-sample column behind a runs-frame latency column, and its statistic over resamples."""
    return ("latency_s", np.median) if latency == "latency_median_s" else (latency, np.mean)


def with_intervals(runs: pd.DataFrame, samples: pd.DataFrame, latency: str = "latency_s") -> pd.DataFrame:
    """`runs` with INTERVAL_COLUMNS from `samples` and `frontier_share`; runs without samples keep what they recorded."""
    out = runs.reindex(columns=[*runs.columns, *(column for column in INTERVAL_COLUMNS if column not in runs)])
    by_run = {run_dir: block for run_dir, block in samples.groupby("run_dir", sort=False)}
    base = runs[runs["method"] == baseline_method()].sort_values("latency_s")  # the fastest per comparison, as in load_runs
    baselines = {comparison: block.iloc[0] for comparison, block in base.groupby("comparison", sort=False)}
    column, statistic = _latency_statistic(latency)
    for index, run in runs.iterrows():
        mine = by_run.get(run["run_dir"])
        if mine is None or mine.empty:
            continue
        values = _run_intervals(mine, column, statistic)
        baseline = baselines.get(run["comparison"])
        if baseline is not None and baseline["run_dir"] in by_run:
            values.update(_paired_columns(run, baseline, mine, by_run[baseline["run_dir"]]))
        for key, value in values.items():
            out.at[index, key] = np.nan if value is None else value
    out["frontier_share"] = frontier_stability(runs, by_run, latency)
    return out


def _run_intervals(mine: pd.DataFrame, latency_column: str, statistic: Callable[..., np.ndarray]) -> dict[str, Any]:
    accuracy = accuracy_estimate(mine["correct"].astype(float).to_numpy(), list(mine["id"]))
    values: dict[str, Any] = {"accuracy_se": accuracy.se, "accuracy_ci_low": accuracy.low, "accuracy_ci_high": accuracy.high}
    per_problem = _means(mine, latency_column).means
    interval = bootstrap_interval(per_problem, statistic) if np.isfinite(per_problem).all() else None
    if interval is not None:
        values.update(latency_ci_low=interval[0], latency_ci_high=interval[1])
    return values


def _paired_columns(run: pd.Series, baseline: pd.Series, mine: pd.DataFrame, theirs: pd.DataFrame) -> dict[str, Any]:
    """The speedup split (from the runs' means) with its paired intervals, and the accuracy difference."""
    values: dict[str, Any] = speedup_split({"tokens": _known(run["tokens"])}, {"tokens": _known(baseline["tokens"])},
                                           _known(run["speedup"]))
    diff = paired_accuracy_difference(_means(mine, "correct"), _means(theirs, "correct"))
    values.update(accuracy_diff=diff.difference, accuracy_diff_se=diff.se, accuracy_diff_p=diff.p_value)
    intervals = speedup_intervals({"run": _means(mine, "latency_s"), "baseline": _means(theirs, "latency_s")},
                                  {"run": _means(mine, "tokens"), "baseline": _means(theirs, "tokens")})
    for name, interval in (("speedup_ci", intervals.speedup), ("token_ratio_ci", intervals.token_ratio),
                           ("per_token_latency_ratio_ci", intervals.per_token_latency_ratio)):
        if interval is not None:
            values.update({f"{name}_low": interval[0], f"{name}_high": interval[1]})
    return values


def frontier_stability(runs: pd.DataFrame, by_run: Mapping[str, pd.DataFrame], latency: str = "latency_s") -> pd.Series:
    """Per run, the share of paired resamples of its comparison's problems that put it on the Pareto frontier."""
    share = pd.Series(np.nan, index=runs.index)
    column, statistic = _latency_statistic(latency)
    for _, group in runs.groupby("comparison", sort=False):
        members = [i for i in group.index if runs.at[i, "run_dir"] in by_run]
        blocks = [by_run[runs.at[i, "run_dir"]] for i in members]
        correct = [_means(b, "correct") for b in blocks]
        latencies = [_means(b, column) for b in blocks]
        ids = shared_problems(*correct) if correct else []
        if len(ids) < 2:
            continue
        rows = bootstrap_indices(len(ids))
        accuracy = np.stack([c.take(ids)[rows].mean(axis=1) for c in correct], axis=1)  # [resample, run]
        latency_values = np.stack([statistic(lat.take(ids)[rows], axis=-1) for lat in latencies], axis=1)
        share.loc[members] = pareto_order_and_mask(accuracy, latency_values)[1].mean(axis=0)
    return share
