"""A composed config's stored run, looked up without decoding (scripts/results_real.py renders
its tables from these): its summary, the summary of its saved samples while it is unfinished, and
its speedup once its baseline exists."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rstitch.methods import build_method
from rstitch.results.keys import comparison_dir, run_dir
from rstitch.results.metrics import COMPARISON_KEYS, accuracy_uncertainty, compare_with_baseline
from rstitch.results.store import iter_samples
from rstitch.results.summary import summarize_run


def config_run_dir(cfg: dict[str, Any]) -> Path:
    """The run directory of a composed config (it names its results_root)."""
    return run_dir(cfg["results_root"], cfg)


def saved_summary(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """summary.json of the config's run, else the partial summary of its saved samples; None when
    nothing is saved."""
    path = config_run_dir(cfg) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else partial_summary(cfg)


def partial_summary(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of an unfinished run's saved samples (the first n problems), without a speedup:
    its baseline's mean covers other problems. None when nothing is saved."""
    path = config_run_dir(cfg) / "samples.jsonl"
    samples = list(iter_samples(path)) if path.is_file() else []
    if not samples:
        return None
    summary = summarize_run(cfg, build_method(**cfg["method"]), samples, comparison_dir(cfg["results_root"], cfg))
    return {**summary, **dict.fromkeys(COMPARISON_KEYS), "partial": True}


def with_speedup(cfg: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run that finished before its `llm_only` baseline existed has no speedup in its own
    summary: look the baseline up again now (with the speedup split and the paired comparison; also
    for a summary written before summaries had intervals). An unfinished run keeps none (its
    baseline covers other problems)."""
    if summary is None or summary.get("partial") or summary.get("speedup_ci") is not None:
        return summary
    samples = list(iter_samples(config_run_dir(cfg) / "samples.jsonl"))
    root = comparison_dir(cfg["results_root"], cfg)
    return {**summary, **accuracy_uncertainty(samples), **compare_with_baseline(summary, samples, root)}
