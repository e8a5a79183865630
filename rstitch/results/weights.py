"""Which weights a run used: a fingerprint of every local checkpoint its config names.

Paths alone do not identify a model: a checkpoint retrained in place keeps its path, and a run
keyed by paths would resume into, and take its speedup from, results of the old weights. The
fingerprints go into the comparison and run keys, so new weights get their own run directories
and their own baselines. Hub ids are not local paths and are keyed by name, as before.

A fingerprint reads each file's name and size, and its content up to 2 MiB (the first and last
MiB of larger files), so it costs milliseconds even for sharded 32B checkpoints; a retrained
model changes the bytes of every tensor, and so the head and tail of each shard.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, TypeGuard

CHUNK = 1 << 20
PAIR_ROLES = ("slm", "llm")


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
    """A string that names an existing file or directory as a path (absolute, or with a
    separator): a bare word such as a method name may match a folder of the working directory."""
    if not isinstance(value, str) or not value:
        return False
    value = os.path.expanduser(value)
    looks_like_path = os.path.isabs(value) or os.sep in value or value.startswith(".")
    return looks_like_path and os.path.exists(value)


def pair_weights(pair: dict[str, Any]) -> dict[str, str]:
    """Fingerprints of the pair's local models, by role."""
    models = {role: (pair.get(role) or {}).get("path") for role in PAIR_ROLES}
    return {role: fingerprint(os.path.expanduser(path)) for role, path in models.items() if is_local(path)}


def method_weights(method: dict[str, Any]) -> dict[str, str]:
    """Fingerprints of every local path among the method's options (router, PRM, latency
    models...), by dotted option name."""
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
