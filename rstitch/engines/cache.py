"""Loaded model pairs, reused across the jobs of a sweep and the analyses of one process."""
from __future__ import annotations

import json
from typing import Any

from rstitch.engines import ModelPair, load_pair
from rstitch.engines.loading import run_model_specs

_PAIRS: dict[str, ModelPair] = {}


def get_pair(pair_cfg: dict[str, Any], engine_cfg: dict[str, Any]) -> ModelPair:
    """The pair of a run config's `pair` and `engine` groups, loaded once and then reused."""
    cache_key = _cache_key(pair_cfg, engine_cfg)
    if cache_key not in _PAIRS:
        _PAIRS.clear()  # one pair at a time: a sweep over pairs must not keep every pair in (GPU) memory
        specs = run_model_specs(pair_cfg, engine_cfg)
        _PAIRS[cache_key] = load_pair(specs["slm"], specs["llm"], engine=engine_cfg["name"])
    return _PAIRS[cache_key]


def is_loaded(pair_cfg: dict[str, Any], engine_cfg: dict[str, Any]) -> bool:
    """Whether `get_pair` would reuse a loaded pair (its memory already in use)."""
    return _cache_key(pair_cfg, engine_cfg) in _PAIRS


def _cache_key(pair_cfg: dict[str, Any], engine_cfg: dict[str, Any]) -> str:
    return json.dumps([pair_cfg, engine_cfg], sort_keys=True)


def clear_pairs() -> None:
    """Drop the loaded pair (e.g. before loading another engine's in a benchmark)."""
    _PAIRS.clear()
