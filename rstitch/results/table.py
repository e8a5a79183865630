"""Run summaries as a table, for notebooks and reports."""
from __future__ import annotations

import os

import pandas as pd

from rstitch.results.keys import is_sharded
from rstitch.results.store import find_summaries

COLUMNS = ("pair", "dataset", "method", "run_tag", "n_samples", "accuracy", "latency_s", "speedup", "tokens",
           "tokens_slm", "tokens_llm", "llm_token_share", "flops")


def load_summaries(root: str | os.PathLike) -> pd.DataFrame:
    """One row per run under `root`, with the method's parameters as `method.<name>` columns. Runs
    over one shard of a dataset are left out: they are parts of a run (`rstitch-merge` makes it)."""
    rows = []
    for summary in find_summaries(root):
        if is_sharded(summary.get("config", {}).get("dataset", {})):
            continue
        row = {c: summary.get(c) for c in COLUMNS}
        params = summary.get("config", {}).get("method", {})
        row.update({f"method.{k}": v for k, v in params.items() if k != "name" and not isinstance(v, (dict, list))})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else list(COLUMNS))
    return frame.sort_values(["pair", "dataset", "method", "latency_s"], ignore_index=True) if rows else frame


def pareto_front(frame: pd.DataFrame, accuracy: str = "accuracy", latency: str = "latency_s") -> pd.DataFrame:
    """Runs that no other run beats on both accuracy (higher) and latency (lower)."""
    ordered = frame.sort_values([latency, accuracy], ascending=[True, False])
    best, keep = float("-inf"), []
    for index, row in ordered.iterrows():
        if row[accuracy] > best:
            keep.append(index)
            best = row[accuracy]
    return frame.loc[keep]
