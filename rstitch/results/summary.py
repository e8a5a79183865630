"""summary.json of a run: the common metrics, the method's own and the speedups, and the console
table of it (`rstitch-run`, `rstitch-merge`)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstitch.grading.version import GRADER_VERSION
from rstitch.results.keys import comparison_key, run_tag
from rstitch.results.metrics import find_speedups, summarize_samples
from rstitch.results.store import find_summaries

if TYPE_CHECKING:  # results are read without the methods (and their engines) loaded
    from rstitch.methods import Method


def summarize_run(cfg: dict[str, Any], method: Method, samples: list[dict[str, Any]], results_root: str | Path) -> dict[str, Any]:
    """summary.json of a run (or of merged shards): the common metrics, the method's own, and the
    speedup over the LLM-only (`baseline: target`) run with the same comparison key under `results_root`."""
    common = {
        "method": method.name,
        "pair": cfg["pair"]["name"],
        "dataset": cfg["dataset"]["name"],
        "run_tag": run_tag(cfg),
        **summarize_samples(samples),
        "batch_size": cfg.get("batch_size", 1),
        "latency_estimated": any(s.get("latency_estimated") for s in samples),
        "comparison_key": comparison_key(cfg),
        "config": cfg,
        "speedup": None,
        "speedup_tokens_per_s": None,
        "grader_version": GRADER_VERSION,  # rstitch-regrade grades a run of an older grader again
    }
    own = method.summarize(samples)
    clash = sorted(set(own) & set(common))
    if clash:  # a method's key must not silently replace a common metric
        raise ValueError(f"method '{method.name}' summarizes keys of the common summary: {', '.join(clash)}")
    summary = {**common, **own}
    if method.baseline == "target":
        summary.update(speedup=1.0, speedup_tokens_per_s=1.0)
    else:
        summary.update(find_speedups(summary, find_summaries(results_root)))
    return summary


TABLE_COLUMNS = (("method", "method", "{}"), ("tag", "run_tag", "{}"), ("n", "n_samples", "{}"),
                 ("accuracy", "accuracy", "{:.3f}"), ("latency_s", "latency_s", "{:.3f}"), ("tokens", "tokens", "{:.1f}"),
                 ("slm_tok", "tokens_slm", "{:.1f}"), ("llm_tok", "tokens_llm", "{:.1f}"), ("switches", "switches", "{:.1f}"),
                 ("speedup", "speedup", "{:.2f}"), ("tok/s_speedup", "speedup_tokens_per_s", "{:.2f}"))


def format_table(*summaries: dict[str, Any]) -> str:
    """One row per run summary, right-aligned; a missing value is "-"."""
    rows = [[("-" if s.get(key) is None else fmt.format(s[key])) for _, key, fmt in TABLE_COLUMNS] for s in summaries]
    headers = [header for header, _, _ in TABLE_COLUMNS]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [headers, *rows])
