"""Run identity, defined here only. The comparison key says which runs are comparable (same pair and weights, data,
budget, decoding, seed); the run key adds the method and its checkpoints' weights, and names the run directory
`<results_root>/<pair>/<dataset>/<method>/<params>_<hash>`, which the runner, `rstitch-run` (through resolvers that
cli/run.py registers), `rstitch-merge` and the scripts all take from here."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from rstitch.configs import CONF_DIR

# Paths alone do not identify a model: a checkpoint retrained in place keeps its path, and a run keyed by paths would
# resume into, and take its speedup from, results of the old weights. So the fingerprints of every local checkpoint a
# config names go into the comparison and run keys (hub ids are keyed by name). A fingerprint reads each file's name,
# size and content up to 2 MiB (the first and last MiB of larger files): milliseconds even for sharded 32B checkpoints,
# while a retrained model changes the bytes of every tensor, and so the head and tail of each shard.

CHUNK = 1 << 20


def fingerprint(path: str | os.PathLike) -> str:
    """A short content hash of the file or directory tree at `path`."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    digest = hashlib.sha1()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(root) if root.is_dir() else file.name}\0{size}\0".encode())
        with open(file, "rb") as f:
            if size <= 2 * CHUNK:
                digest.update(f.read())
            else:
                digest.update(f.read(CHUNK))
                f.seek(size - CHUNK)
                digest.update(f.read(CHUNK))
    return digest.hexdigest()[:12]


def is_local(value: Any) -> TypeGuard[str]:
    """An existing path written as one (absolute, `.`, a separator): a bare word such as a method name may name a folder too."""
    if not isinstance(value, str) or not value:
        return False
    value = os.path.expanduser(value)
    looks_like_path = os.path.isabs(value) or os.sep in value or value.startswith(".")
    return looks_like_path and os.path.exists(value)


def pair_weights(pair: dict[str, Any]) -> dict[str, str]:
    """Fingerprints of the pair's local models, by role."""
    models = {role: (pair.get(role) or {}).get("path") for role in ("slm", "llm")}
    return {role: fingerprint(os.path.expanduser(path)) for role, path in models.items() if is_local(path)}


def method_weights(method: dict[str, Any]) -> dict[str, str]:
    """Fingerprints of every local path among the method's options (router, PRM, latency models...), by dotted name."""
    found: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key != "name":
                    walk(value, f"{prefix}{key}.")
        elif is_local(node):
            found[prefix.rstrip(".")] = fingerprint(os.path.expanduser(node))

    walk(method, "")
    return found


# The config entries a run's identity is computed from (the run key below reads no others).
RUN_KEY_FIELDS = ("pair", "engine", "dataset", "prompt", "max_new_tokens", "decoding", "n_samples", "method", "on_overflow",
                  "batch_size")
RUN_DIR_DEPTH = 4  # <results_root>/<pair>/<dataset>/<method>/<tag>: the tag and three levels above it


def is_sharded(dataset: dict[str, Any]) -> bool:
    """`dataset.num_shards > 1`; a malformed value counts as unsharded, so that naming the run directory never
    fails (loading the records rejects it with one error line)."""
    count = dataset.get("num_shards")
    return isinstance(count, int) and not isinstance(count, bool) and count > 1


def dataset_key(dataset: dict[str, Any]) -> dict[str, Any]:
    """An unsharded run's key has no shard fields: the key runs had before sharding, and of its shards once merged.
    `source` is left out too: the dataset's name (conf/dataset/<name>.yaml) fixes it."""
    left_out = ("source",) if is_sharded(dataset) else ("source", "shard", "num_shards")
    return {k: v for k, v in dataset.items() if k not in left_out}


def unsharded(dataset: dict[str, Any]) -> dict[str, Any]:
    """The dataset options of the whole selection a shard belongs to."""
    return {**dataset, "shard": 0, "num_shards": 1}


def portable(node: Any) -> Any:
    """`node` with every local path by its last component: the key names an asset, its fingerprint says which
    one, and two checkouts in different places share run keys."""
    if isinstance(node, dict):
        return {key: portable(value) for key, value in node.items()}
    if isinstance(node, list):
        return [portable(value) for value in node]
    return os.path.basename(os.path.normpath(os.path.expanduser(node))) if is_local(node) else node


def engine_key(engine: Mapping[str, Any], pair: Mapping[str, Any]) -> dict[str, Any]:
    """The engine options a run is keyed by, with `compile` as the decode path the engine's class
    says they resolve to on the pair's device (`decode_path_key`; none: the eager path's key)."""
    from rstitch.engines import engine_class  # torch, for run keys only

    options = {k: v for k, v in engine.items() if k != "compile"}
    path = engine_class(engine.get("name")).decode_path_key(engine, str(pair.get("device", "cpu")))  # no name: the default
    return options if path is None else {**options, "compile": path}


def comparison_key(cfg: Mapping[str, Any]) -> dict[str, Any]:
    data_path = cfg["dataset"].get("path")
    return {
        "pair": portable(cfg["pair"]),
        "weights": pair_weights(cfg["pair"]),
        "engine": portable(engine_key(cfg["engine"], cfg["pair"])),
        "dataset": portable(dataset_key(cfg["dataset"])),
        **({"data": fingerprint(os.path.expanduser(data_path))} if is_local(data_path) else {}),
        "prompt": portable(cfg["prompt"]),
        "max_new_tokens": cfg["max_new_tokens"],
        "decoding": cfg["decoding"],
        "n_samples": cfg["n_samples"],
        # Only a cut budget changes what is recorded; error and skip record the same samples.
        **({"on_overflow": "truncate"} if cfg.get("on_overflow") == "truncate" else {}),
        # Batched runs record estimated latencies: their own runs. Batch 1 keeps the key it always had.
        **({"batch_size": cfg["batch_size"]} if cfg.get("batch_size", 1) != 1 else {}),
    }


def key_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves where two keys (or configs) differ: `dataset.limit`."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix.rstrip(".") or "value"]
    out: list[str] = []
    for k in sorted(set(a) | set(b)):
        out += key_differences(a.get(k), b.get(k), f"{prefix}{k}.")
    return out


def run_key(cfg: dict[str, Any], comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    """The comparison key (`comparison`, where it is known) with the method and its weights."""
    return {**(comparison or comparison_key(cfg)), "method": portable(cfg["method"]), "method_weights": method_weights(cfg["method"])}


def short_hash(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]


def run_tag(cfg: dict[str, Any], key_hash: str | None = None) -> str:
    """The method's short parameters, the shard (`shard=1of4`), then a hash of the whole run key (`key_hash`, where known)."""
    method = portable(cfg["method"])
    params = [f"{k}={v}" for k, v in sorted(method.items()) if k != "name" and _short_setting(v)]
    dataset = cfg["dataset"]
    if is_sharded(dataset):
        params.append(f"shard={dataset.get('shard')}of{dataset['num_shards']}")
    if cfg.get("batch_size", 1) != 1:
        params.append(f"batch={cfg['batch_size']}")
    return "_".join([*params, key_hash or short_hash(run_key(cfg))])


def settings_tag(cfg: dict[str, Any], key_hash: str | None = None) -> str:
    """What the console and the sweep table show: `run_tag` with only the method's settings that differ from its
    defaults (RSD's default run reads `f81ca936`); the run directory keeps `run_tag`, where a resume looks."""
    method = portable(cfg["method"])
    defaults = method_defaults(str(method.get("name")))
    shown = {k: v for k, v in method.items() if k == "name" or k not in defaults or (defaults[k] is not INTERPOLATED and defaults[k] != v)}
    return run_tag({**cfg, "method": shown}, key_hash or short_hash(run_key(cfg)))


INTERPOLATED = object()  # a default set by an interpolation (`prm: ${prm}`, an asset path): left to the hash


def method_defaults(name: str) -> dict[str, Any]:
    """conf/method/<name>.yaml's values (INTERPOLATED where computed from others); empty without the file."""
    import yaml

    path = CONF_DIR / "method" / f"{name}.yaml"
    if not path.is_file():
        return {}
    loaded = yaml.safe_load(path.read_text()) or {}
    return {k: INTERPOLATED if isinstance(v, str) and "${" in v else v for k, v in loaded.items()}


def _short_setting(value: Any) -> bool:
    """Fit for a directory name: a scalar of up to 24 characters (longer ones are left to the hash and run_key.json),
    without path separators or control characters (a prompt's newlines)."""
    if isinstance(value, (dict, list)):
        return False
    text = str(value)
    return len(text) <= 24 and "/" not in text and os.sep not in text and text.isprintable()


def comparison_dir(results_root: str | Path, cfg: Mapping[str, Any]) -> Path:
    """Where runs comparable to `cfg` (same pair and dataset) live: <results_root>/<pair>/<dataset>."""
    return Path(results_root) / cfg["pair"]["name"] / cfg["dataset"]["name"]


def run_subdir(cfg: Mapping[str, Any], tag: str | None = None) -> Path:
    """The run directory below results_root: <pair>/<dataset>/<method>/<tag> (`run_tag` unless given)."""
    return Path(cfg["pair"]["name"]) / cfg["dataset"]["name"] / cfg["method"]["name"] / (tag or run_tag(dict(cfg)))


def run_dir(results_root: str | Path, cfg: Mapping[str, Any]) -> Path:
    """The directory of `cfg`'s run: <results_root>/<pair>/<dataset>/<method>/<params>_<hash>."""
    return Path(results_root) / run_subdir(cfg)


def run_name(cfg: Mapping[str, Any]) -> str:
    """The run's name for loggers (W&B): its directory below results_root."""
    return run_subdir(cfg).as_posix()


@dataclass(frozen=True)
class RunIdentity:
    """A run's identity, computed once (the weights fingerprinted once) and handed on in place of its config."""

    config: dict[str, Any]
    comparison_key: dict[str, Any]
    run_key: dict[str, Any]
    run_tag: str  # names the run directory
    setting_tag: str  # what the console shows
    comparison_root: Path  # where the runs comparable to it live (its baseline among them)
    run_dir: Path

    @property
    def name(self) -> str:
        """The run's name for loggers: `run_name`."""
        return run_subdir(self.config, self.run_tag).as_posix()


def identify(cfg: dict[str, Any], comparison_root: str | Path, run_dir: str | Path | None = None) -> RunIdentity:
    """The identity of `cfg`'s run below `comparison_root` (`comparison_dir`), in `run_dir` if given."""
    comparison = comparison_key(cfg)
    key = run_key(cfg, comparison)
    key_hash = short_hash(key)
    tag = run_tag(cfg, key_hash)
    root = Path(comparison_root)
    where = Path(run_dir) if run_dir is not None else root / cfg["method"]["name"] / tag
    return RunIdentity(cfg, comparison, key, tag, settings_tag(cfg, key_hash), root, where)
