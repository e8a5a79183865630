"""Per-run aggregates: the accuracy-latency point and costs."""
from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

PER_MODEL_TOKEN_KEYS = ("tokens_slm", "tokens_llm")


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
        "latency_s": statistics.fmean(latencies),
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
    estimates = [r["latency_estimate_s"] for r in rows if r.get("latency_estimate_s") is not None]
    summary["latency_estimate_s"] = statistics.fmean(estimates) if len(estimates) == len(rows) else None
    for model in ("slm", "llm"):
        summary[f"forward_time_s_{model}"] = statistics.fmean(r["cost"][model]["forward_time_s"] for r in rows)
        summary[f"forward_calls_{model}"] = statistics.fmean(r["cost"][model]["forward_calls"] for r in rows)
    return summary


def baseline_method() -> str:
    """The method every speedup is measured against, read from the methods' metadata (the class
    whose `baseline` role is "target")."""
    from rstitch.methods import baseline_method as target_baseline  # lazy: the registry imports the engines

    return target_baseline()


def comparison_key_matches(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("comparison_key") == b.get("comparison_key")


def find_speedup(summary: dict[str, Any], others: Iterable[dict[str, Any]]) -> float | None:
    """Lat(llm_only) / Lat(method) against the LLM-only run of the same pair, data, budget, seed."""
    return find_speedups(summary, others)["speedup"]


def find_speedups(summary: dict[str, Any], others: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """Against the matching LLM-only run: `speedup`, the latency ratio Lat(llm_only) / Lat(method),
    and `speedup_tokens_per_s`, the throughput ratio (tokens/s of the method over LLM-only's), the
    speedup EASD and speculative decoding papers report. They differ when the outputs' lengths differ."""
    out: dict[str, float | None] = {"speedup": None, "speedup_tokens_per_s": None}
    baseline = baseline_method()
    for other in others:
        if other.get("method") == baseline and comparison_key_matches(summary, other):
            if other.get("latency_s") and summary.get("latency_s"):
                out["speedup"] = other["latency_s"] / summary["latency_s"]
            if other.get("tokens_per_s") and summary.get("tokens_per_s"):
                out["speedup_tokens_per_s"] = summary["tokens_per_s"] / other["tokens_per_s"]
            break
    return out
