"""Export the hub benchmarks at their pinned revisions to local JSONL copies, once, online.

Runs (and the tests) then read them offline:

    python scripts/export_benchmarks.py --out ~/rstitch-benchmarks
    rstitch-run dataset=math500 dataset.path=~/rstitch-benchmarks/math500.jsonl
    RSTITCH_BENCHMARKS=~/rstitch-benchmarks pytest -m "not slow"

The rows are those a run without `dataset.path` reads from the hub (rstitch/data/export.py);
PROVENANCE.jsonl in the output folder records each file's hub id, revision, size and sha256.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rstitch.data.export import DEFAULT_DATASETS, export_dataset
from rstitch.errors import exit_on_config_error


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSONL files")
    parser.add_argument("datasets", nargs="*", default=list(DEFAULT_DATASETS),
                        help=f"dataset names (default: {' '.join(DEFAULT_DATASETS)}, the ones the tests read)")
    args = parser.parse_args()
    for name in args.datasets:
        done = export_dataset(name, args.out.expanduser())
        print(f"{done['file']}: {done['records']} records of {done['hf_id']} @ {str(done['revision'])[:8]}")


if __name__ == "__main__":
    main()
