"""Local copies of the hub benchmarks at their pinned revisions, written once as JSONL for offline
runs and the tests (`dataset.path=<dir>/<file>`, `RSTITCH_BENCHMARKS=<dir>`; scripts/export_benchmarks.py)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from rstitch.data.datasets import get_dataset_spec, load_dataset_records, read_hub_rows
from rstitch.errors import ConfigError

# The benchmarks the tests read (tests/conftest.py, benchmark_file) and their file names there.
DEFAULT_DATASETS = ("math500", "gsm8k", "aime24", "amc23", "minerva")
FILE_NAMES = {"minerva": "minerva_math.jsonl"}
PROVENANCE_FILE = "PROVENANCE.jsonl"


def export_file_name(name: str) -> str:
    return FILE_NAMES.get(name, f"{name}.jsonl")


def export_dataset(name: str, out_dir: str | os.PathLike) -> dict[str, object]:
    """Write dataset `name`'s hub rows at its pinned revision to `out_dir` as JSONL (atomically),
    check that they load as records, and return its provenance (file, hub id, revision, records,
    sha256), which is also appended to `out_dir`/PROVENANCE.jsonl."""
    spec = get_dataset_spec(name)
    if spec.hf_id is None:
        raise ConfigError(f"dataset '{spec.name}' is not read from the hub (it is generated or installed); nothing to export")
    rows = read_hub_rows(spec, spec.revision)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / export_file_name(spec.name)
    text = "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    records = load_dataset_records(spec.name, path=str(path))  # the same normalizer as the hub's rows
    provenance: dict[str, object] = {"file": path.name, "dataset": spec.name, "hf_id": spec.hf_id, "config": spec.config, "split": spec.split,
                  "revision": spec.revision, "records": len(records), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    with (out / PROVENANCE_FILE).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(provenance) + "\n")
    return provenance
