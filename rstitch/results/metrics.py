"""Per-run aggregates: the accuracy-latency point and costs."""
from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rstitch.methods import baseline_method
from rstitch.results.schema import Comparison
from rstitch.results.store import SAMPLES_FILE, iter_samples, run_summaries
from rstitch.results.uncertainty import (
    ProblemMeans,
    accuracy_estimate,
    bootstrap_interval,
    paired_accuracy_difference,
    problem_means,
    speedup_intervals,
    speedup_split,
)


def summarize_samples(samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy is pass@1 averaged over all samples of all problems (k samples each)."""
    rows = list(samples)
    if not rows:
        return {"n_samples": 0}
    mean = lambda key: statistics.fmean(float(r.get(key, 0) or 0) for r in rows)  # noqa: E731
    latencies = [r["latency_s"] for r in rows]
    accuracy = accuracy_estimate([float(r.get("correct", 0) or 0) for r in rows], [r["id"] for r in rows])
    summary = {
        "n_problems": len({r["id"] for r in rows}),
        "n_samples": len(rows),
        "accuracy": mean("correct"),
        "accuracy_se": accuracy.se,  # clustered by problem
        "accuracy_ci": None if accuracy.low is None else [accuracy.low, accuracy.high],  # Wilson, at the effective sample size
        "latency_s": statistics.fmean(latencies),
        "latency_ci": _pair(bootstrap_interval(problem_means(latencies, [r["id"] for r in rows]).means)),
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
        "latency_cpu_s": mean_of_every(map(sample_cpu_time, rows)),
        "latency_estimate_s": mean_of_every(r.get("latency_estimate_s") for r in rows),
    }
    for key in ("forward_time_s", "forward_calls"):
        summary.update({f"{key}_{model}": statistics.fmean(r["cost"][model][key] for r in rows) for model in ("slm", "llm")})
    return summary


def sample_cpu_time(row: dict[str, Any]) -> float | None:
    """A CPU decode's CPU seconds; None on a GPU (the CPU only launches kernels), batched, or an older run."""
    measured = row.get("measurement") or {}
    if not str(measured.get("device", "")).startswith("cpu"):
        return None
    return measured.get("cpu_s")


def mean_of_every(values: Iterable[float | None]) -> float | None:
    """The mean of the samples' values (CPU times, latency estimates) where every sample has one, else None."""
    known = list(values)
    return None if any(v is None for v in known) else statistics.fmean(known)  # type: ignore[arg-type]


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


def find_speedups(summary: dict[str, Any], others: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """Against the LLM-only run of the same comparison key: SPEEDUP_LATENCIES' ratios (`speedup`: Lat(llm_only) / Lat(method))
    and the throughput ratio EASD reports."""
    found = find_baseline_run(summary, ((None, other) for other in others))
    return speedups_against(summary, found[1]) if found else dict.fromkeys([*SPEEDUP_LATENCIES.values(), "speedup_tokens_per_s"])


# Each speedup and the latency it is the ratio of (docs/analysis.md, "Timings on a shared machine").
SPEEDUP_LATENCIES = {"latency_s": "speedup", "latency_cpu_s": "speedup_cpu", "latency_estimate_s": "speedup_estimate"}


def speedups_against(summary: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for latency, speedup in SPEEDUP_LATENCIES.items():
        out[speedup] = baseline[latency] / summary[latency] if baseline.get(latency) and summary.get(latency) else None
    both = summary.get("tokens_per_s") and baseline.get("tokens_per_s")
    out["speedup_tokens_per_s"] = summary["tokens_per_s"] / baseline["tokens_per_s"] if both else None
    return out


COMPARISON_KEYS = tuple(Comparison.__annotations__)  # None where there is no baseline run (or no samples of it)


def self_comparison(summary: dict[str, Any]) -> dict[str, Any]:
    """The baseline against itself: exact, so every interval is a point."""
    ratios = {"speedup": 1.0, "speedup_cpu": 1.0 if summary.get("latency_cpu_s") is not None else None,
              "speedup_estimate": 1.0 if summary.get("latency_estimate_s") is not None else None,
              "token_ratio": 1.0, "per_token_latency_ratio": 1.0}
    return {**ratios, **{f"{name}_ci": None if ratio is None else [ratio, ratio] for name, ratio in ratios.items()},
            "speedup_tokens_per_s": 1.0, "token_reduction": 0.0, "accuracy_diff": 0.0, "accuracy_diff_se": 0.0,
            "accuracy_diff_p": 1.0, "accuracy_diff_test": None, "paired_problems": summary.get("n_problems")}


def find_baseline_run(summary: dict[str, Any], runs: Iterable[tuple[Any, dict[str, Any]]]) -> tuple[Any, dict[str, Any]] | None:
    """The LLM-only run among `runs` ((run directory, summary) pairs) with the summary's comparison key."""
    baseline, key = baseline_method(), summary.get("comparison_key")
    return next(((where, other) for where, other in runs if other.get("method") == baseline and other.get("comparison_key") == key), None)


def compare_with_baseline(summary: dict[str, Any], samples: list[dict[str, Any]], root: str | Path) -> dict[str, Any]:
    """Every key of COMPARISON_KEYS against the matching LLM-only run under `root`."""
    out: dict[str, Any] = dict.fromkeys(COMPARISON_KEYS)
    found = find_baseline_run(summary, run_summaries(root))
    if found is None:
        return out
    run_dir, baseline = found
    out.update(speedups_against(summary, baseline))
    out.update(speedup_split(summary, baseline, out["speedup"]))
    path = run_dir / SAMPLES_FILE
    if path.exists() and samples:
        out.update(paired_statistics(samples, list(iter_samples(path))))
    return out


def paired_statistics(samples: list[dict[str, Any]], baseline_samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the shared problems: the paired accuracy difference and the speedups' and split's intervals."""
    runs = {"run": samples, "baseline": baseline_samples}

    def means(value: Callable[[dict[str, Any]], float | None]) -> dict[str, ProblemMeans] | None:
        """Per run, the per-problem means of `value`; None where a sample lacks it (CPU time, estimate)."""
        values = {who: [value(r) for r in rows] for who, rows in runs.items()}
        if any(v is None for column in values.values() for v in column):
            return None
        return {who: problem_means(values[who], [r["id"] for r in rows]) for who, rows in runs.items()}  # type: ignore[arg-type]

    def count(key: str) -> dict[str, ProblemMeans]:
        return means(lambda r: float(r.get(key, 0) or 0)) or {}

    correct, tokens = count("correct"), count("tokens")
    speedup_ci = {name: None if latency is None else _pair(speedup_intervals(latency, tokens).speedup)
                  for name, latency in (("speedup_cpu_ci", means(sample_cpu_time)),
                                        ("speedup_estimate_ci", means(lambda r: r.get("latency_estimate_s"))))}
    diff = paired_accuracy_difference(correct["run"], correct["baseline"])
    intervals = speedup_intervals(count("latency_s"), tokens)
    return {"accuracy_diff": None if np.isnan(diff.difference) else diff.difference, "accuracy_diff_se": diff.se,
            "accuracy_diff_p": diff.p_value, "accuracy_diff_test": diff.test, "paired_problems": diff.n_problems,
            "speedup_ci": _pair(intervals.speedup), "token_ratio_ci": _pair(intervals.token_ratio),
            "per_token_latency_ratio_ci": _pair(intervals.per_token_latency_ratio), **speedup_ci}
