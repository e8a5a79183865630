"""Per-run aggregates: the accuracy-latency point and costs."""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rstitch.methods import baseline_method
from rstitch.results.schema import Comparison
from rstitch.results.store import SAMPLES_FILE, SUMMARY_FILE, iter_samples
from rstitch.results.uncertainty import (
    accuracy_estimate,
    bootstrap_mean_interval,
    paired_accuracy_difference,
    problem_means,
    speedup_intervals,
)


def summarize_samples(samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy is pass@1 averaged over all samples of all problems (k samples each)."""
    rows = list(samples)
    if not rows:
        return {"n_samples": 0}
    mean = lambda key: statistics.fmean(float(r.get(key, 0) or 0) for r in rows)  # noqa: E731
    latencies = [r["latency_s"] for r in rows]
    summary = {
        "n_problems": len({r["id"] for r in rows}),
        "n_samples": len(rows),
        "accuracy": mean("correct"),
        **accuracy_uncertainty(rows),
        "latency_s": statistics.fmean(latencies),
        "latency_ci": _pair(bootstrap_mean_interval(problem_means(latencies, [r["id"] for r in rows]).means)),
        "latency_median_s": statistics.median(latencies),
        "tokens": mean("tokens"),
        "tokens_slm": mean("tokens_slm"),
        "tokens_llm": mean("tokens_llm"),
        "llm_token_share": sum(r["tokens_llm"] for r in rows) / max(1, sum(r["tokens"] for r in rows)),
        "discarded_tokens": mean("discarded_tokens"),
        "switches": mean("switches"),
        "flops": mean("flops"),
        # Decoding throughput: the paper's speedup for speculative methods (EASD) is a ratio of these.
        "tokens_per_s": sum(r["tokens"] for r in rows) / sum(latencies) if sum(latencies) > 0 else None,
        "finished_by_eos": mean("finished_by_eos"),
        "grading_errors": sum(1 for r in rows if r.get("grading_error")),  # graded wrong (see each sample)
    }
    summary["latency_cpu_s"] = mean_cpu_time(rows)
    estimates = [r["latency_estimate_s"] for r in rows if r.get("latency_estimate_s") is not None]
    summary["latency_estimate_s"] = statistics.fmean(estimates) if len(estimates) == len(rows) else None
    for model in ("slm", "llm"):
        summary[f"forward_time_s_{model}"] = statistics.fmean(r["cost"][model]["forward_time_s"] for r in rows)
        summary[f"forward_calls_{model}"] = statistics.fmean(r["cost"][model]["forward_calls"] for r in rows)
    return summary


def sample_cpu_time(row: dict[str, Any]) -> float | None:
    """A CPU decode's CPU seconds; None on a GPU (the CPU only launches kernels), batched, or an older run."""
    measured = row.get("measurement") or {}
    if not str(measured.get("device", "")).startswith("cpu"):
        return None
    return measured.get("cpu_s")


def mean_cpu_time(rows: list[dict[str, Any]]) -> float | None:
    """`latency_cpu_s`: the mean of the samples' CPU times, where every sample has one."""
    times = [sample_cpu_time(r) for r in rows]
    return None if any(t is None for t in times) else statistics.fmean(times)  # type: ignore[arg-type]


def accuracy_uncertainty(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`accuracy_se` (clustered by problem) and `accuracy_ci` (Wilson, at the effective sample size)."""
    estimate = accuracy_estimate([float(r.get("correct", 0) or 0) for r in rows], [r["id"] for r in rows])
    ci = None if estimate.low is None else [estimate.low, estimate.high]
    return {"accuracy_se": estimate.se, "accuracy_ci": ci}


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


def comparison_key_matches(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("comparison_key") == b.get("comparison_key")


def find_speedup(summary: dict[str, Any], others: Iterable[dict[str, Any]]) -> float | None:
    """Lat(llm_only) / Lat(method) against the LLM-only run of the same pair, data, budget, seed."""
    return find_speedups(summary, others)["speedup"]


def find_speedups(summary: dict[str, Any], others: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """Against the matching LLM-only run: the ratios of SPEEDUP_LATENCIES (docs/analysis.md, "Timings
    on a shared machine") and `speedup_tokens_per_s`, the throughput ratio EASD and speculative decoding report."""
    baseline = baseline_method()
    for other in others:
        if other.get("method") == baseline and comparison_key_matches(summary, other):
            return speedups_against(summary, other)
    return dict.fromkeys(SPEEDUP_LATENCIES.values()) | {"speedup_tokens_per_s": None}


# Each speedup and the latency it is the ratio of: wall clock, the decode's CPU time (CPU runs),
# and the latency model's estimate from the forwards counted (runs with a latency_dir).
SPEEDUP_LATENCIES = {"latency_s": "speedup", "latency_cpu_s": "speedup_cpu", "latency_estimate_s": "speedup_estimate"}


def speedups_against(summary: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for latency, speedup in SPEEDUP_LATENCIES.items():
        out[speedup] = baseline[latency] / summary[latency] if baseline.get(latency) and summary.get(latency) else None
    out["speedup_tokens_per_s"] = None
    if baseline.get("tokens_per_s") and summary.get("tokens_per_s"):
        out["speedup_tokens_per_s"] = summary["tokens_per_s"] / baseline["tokens_per_s"]
    return out


COMPARISON_KEYS = tuple(Comparison.__annotations__)  # None where there is no baseline run (or no samples of it)


def self_comparison(summary: dict[str, Any]) -> dict[str, Any]:
    """The baseline against itself: exact, so every interval is a point."""
    on_cpu, estimated = summary.get("latency_cpu_s") is not None, summary.get("latency_estimate_s") is not None
    return {"speedup": 1.0, "speedup_cpu": 1.0 if on_cpu else None, "speedup_cpu_ci": [1.0, 1.0] if on_cpu else None,
            "speedup_estimate": 1.0 if estimated else None, "speedup_estimate_ci": [1.0, 1.0] if estimated else None,
            "speedup_tokens_per_s": 1.0, "speedup_ci": [1.0, 1.0], "token_ratio": 1.0,
            "token_ratio_ci": [1.0, 1.0], "token_reduction": 0.0, "per_token_latency_ratio": 1.0,
            "per_token_latency_ratio_ci": [1.0, 1.0], "accuracy_diff": 0.0, "accuracy_diff_se": 0.0,
            "accuracy_diff_p": 1.0, "accuracy_diff_test": None, "paired_problems": summary.get("n_problems")}


def find_baseline_run(summary: dict[str, Any], root: str | Path) -> tuple[dict[str, Any], Path] | None:
    """The LLM-only run under `root` with the summary's comparison key, and its directory."""
    baseline = baseline_method()
    for path in Path(root).rglob(SUMMARY_FILE):
        try:
            other = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if other.get("method") == baseline and comparison_key_matches(summary, other):
            return other, path.parent
    return None


def compare_with_baseline(summary: dict[str, Any], samples: list[dict[str, Any]], root: str | Path) -> dict[str, Any]:
    """Every key of COMPARISON_KEYS against the matching LLM-only run under `root`."""
    out: dict[str, Any] = dict.fromkeys(COMPARISON_KEYS)
    found = find_baseline_run(summary, root)
    if found is None:
        return out
    baseline, run_dir = found
    out.update(speedups_against(summary, baseline))
    out.update(speedup_split(summary, baseline, out["speedup"]))
    path = run_dir / SAMPLES_FILE
    if path.exists() and samples:
        out.update(paired_statistics(samples, list(iter_samples(path))))
    return out


def speedup_split(summary: dict[str, Any], baseline: dict[str, Any], speedup: float | None) -> dict[str, float | None]:
    """From the runs' means: token_ratio (R-Stitch's reduction is 1 - it) and per_token_latency_ratio = speedup x token_ratio."""
    tokens, base_tokens = summary.get("tokens"), baseline.get("tokens")
    if not tokens or not base_tokens:
        return {}
    ratio = tokens / base_tokens
    return {"token_ratio": ratio, "token_reduction": 1.0 - ratio,
            "per_token_latency_ratio": None if speedup is None else speedup * ratio}


def paired_statistics(samples: list[dict[str, Any]], baseline_samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the shared problems: the paired accuracy difference and the speedup split's intervals."""
    def grouped(rows: list[dict[str, Any]], key: str):
        return problem_means([float(r.get(key, 0) or 0) for r in rows], [r["id"] for r in rows])

    diff = paired_accuracy_difference(grouped(samples, "correct"), grouped(baseline_samples, "correct"))
    tokens = {"run": grouped(samples, "tokens"), "baseline": grouped(baseline_samples, "tokens")}
    intervals = speedup_intervals({"run": grouped(samples, "latency_s"), "baseline": grouped(baseline_samples, "latency_s")}, tokens)
    return {"accuracy_diff": None if np.isnan(diff.difference) else diff.difference, "accuracy_diff_se": diff.se,
            "accuracy_diff_p": diff.p_value, "accuracy_diff_test": diff.test, "paired_problems": diff.n_problems,
            "speedup_ci": _pair(intervals.speedup), "token_ratio_ci": _pair(intervals.token_ratio),
            "per_token_latency_ratio_ci": _pair(intervals.per_token_latency_ratio),
            "speedup_cpu_ci": paired_speedup_interval(samples, baseline_samples, sample_cpu_time, tokens),
            "speedup_estimate_ci": paired_speedup_interval(samples, baseline_samples, lambda r: r.get("latency_estimate_s"), tokens)}


def paired_speedup_interval(samples: list[dict[str, Any]], baseline_samples: list[dict[str, Any]],
                            latency: Callable[[dict[str, Any]], float | None], tokens: dict[str, Any]) -> list[float] | None:
    """The paired interval of the speedup in another latency (CPU time, estimate); None where a sample lacks it."""
    times = {who: [latency(r) for r in rows] for who, rows in (("run", samples), ("baseline", baseline_samples))}
    if any(t is None for values in times.values() for t in values):
        return None
    means = {who: problem_means(values, [r["id"] for r in rows])  # type: ignore[arg-type]
             for (who, values), rows in zip(times.items(), (samples, baseline_samples))}
    return _pair(speedup_intervals(means, tokens).speedup)
