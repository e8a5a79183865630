"""Run identity. The comparison key says which runs are comparable (same pair and weights, data,
budget, decoding, seed); the run key adds the method and its checkpoints' weights, and names the
run directory."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from rstitch.results.weights import method_weights, pair_weights

SHARD_KEYS = ("shard", "num_shards")


def is_sharded(dataset: dict[str, Any]) -> bool:
    """A run over one shard of the selected records (`dataset.num_shards > 1`). A malformed value
    counts as unsharded here, so that naming the run directory never fails; loading the records
    rejects it with one error line."""
    count = dataset.get("num_shards")
    return isinstance(count, int) and not isinstance(count, bool) and count > 1


def dataset_key(dataset: dict[str, Any]) -> dict[str, Any]:
    """The dataset options that identify a run. An unsharded run's key carries no shard fields, so
    it is the key runs had before sharding existed, and the key of its shards once merged."""
    if is_sharded(dataset):
        return dict(dataset)
    return {k: v for k, v in dataset.items() if k not in SHARD_KEYS}


def unsharded(dataset: dict[str, Any]) -> dict[str, Any]:
    """The dataset options of the whole selection a shard belongs to."""
    return {**dataset, "shard": 0, "num_shards": 1}


def comparison_key(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "pair": cfg["pair"],
        "weights": pair_weights(cfg["pair"]),
        "engine": cfg["engine"],
        "dataset": dataset_key(cfg["dataset"]),
        "prompt": cfg["prompt"],
        "max_new_tokens": cfg["max_new_tokens"],
        "decoding": cfg["decoding"],
        "n_samples": cfg["n_samples"],
    }


def run_key(cfg: dict[str, Any]) -> dict[str, Any]:
    return {**comparison_key(cfg), "method": cfg["method"], "method_weights": method_weights(cfg["method"])}


def short_hash(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]


def run_tag(cfg: dict[str, Any]) -> str:
    """Readable and unique: the method's parameters, the shard (`shard=1of4`), then a hash of the
    whole run key."""
    params = [f"{k}={v}" for k, v in sorted(cfg["method"].items()) if k != "name" and not isinstance(v, (dict, list))]
    dataset = cfg["dataset"]
    if is_sharded(dataset):
        params.append(f"shard={dataset.get('shard')}of{dataset['num_shards']}")
    return "_".join([*params, short_hash(run_key(cfg))])
