"""Run summaries as a table, for notebooks and reports."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from rstitch.results.keys import is_sharded
from rstitch.results.store import run_summaries

COLUMNS = ("pair", "dataset", "method", "run_tag", "n_samples", "accuracy", "latency_s", "speedup", "tokens",
           "tokens_slm", "tokens_llm", "llm_token_share", "flops", "accuracy_se", "accuracy_diff", "accuracy_diff_se",
           "token_ratio", "per_token_latency_ratio")


def load_summaries(root: str | os.PathLike) -> pd.DataFrame:
    """One row per run under `root`, the method's parameters as `method.<name>` columns; shard runs left out."""
    rows = []
    for _, summary in run_summaries(root):
        if is_sharded(summary.get("config", {}).get("dataset", {})):
            continue
        row = {c: summary.get(c) for c in COLUMNS}
        params = summary.get("config", {}).get("method", {})
        row.update({f"method.{k}": v for k, v in params.items() if k != "name" and not isinstance(v, (dict, list))})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else list(COLUMNS))
    return frame.sort_values(["pair", "dataset", "method", "latency_s"], ignore_index=True) if rows else frame


def pareto_front(frame: pd.DataFrame, accuracy: str = "accuracy", latency: str = "latency_s") -> pd.DataFrame:
    """Runs that no other run beats on both accuracy (higher) and latency (lower), by latency."""
    order, keep = pareto_order_and_mask(frame[accuracy].to_numpy(float), frame[latency].to_numpy(float))
    return frame.iloc[order[keep[order]]]


def pareto_order_and_mask(accuracy: np.ndarray, latency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order by (latency, -accuracy, input order) and which points are on the frontier, along the last
    axis (2-D: one point set per bootstrap resample): those more accurate than every point before them."""
    accuracy, latency = np.asarray(accuracy, dtype=float), np.asarray(latency, dtype=float)
    order = np.lexsort((-accuracy, latency), axis=-1)  # stable: ties keep input order
    ordered = np.take_along_axis(accuracy, order, axis=-1)
    before = np.fmax.accumulate(ordered, axis=-1)  # a NaN accuracy is never kept nor raises the bar
    best_before = np.concatenate([np.full(ordered.shape[:-1] + (1,), -np.inf), before[..., :-1]], axis=-1)
    keep = np.zeros(accuracy.shape, dtype=bool)
    np.put_along_axis(keep, order, ordered > best_before, axis=-1)
    return order, keep
