"""Grade each benchmark's own worked solution against its own gold answer.

A sound grader must accept (nearly) all of them: every miss is either an extraction or
normalization bug to fix, or a genuine quirk of the data to document in docs/grading.md.
The check itself is rstitch/data/gold_check.py.

    python scripts/check_gold_grading.py [--benchmarks ../shared/benchmarks]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rstitch.data.gold_check import check_all, report
from rstitch.errors import exit_on_config_error

DEFAULT_BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"  # beside the checkout


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", type=Path, default=DEFAULT_BENCHMARKS, help="folder of benchmark JSONL files")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-answer grading timeout in seconds")
    parser.add_argument(
        "--no-fast-path", action="store_true", help="send every answer to math-verify (checks that path on its own)"
    )
    args = parser.parse_args()
    print(report(check_all(args.benchmarks, args.timeout, fast_path=not args.no_fast_path)))


if __name__ == "__main__":
    main()
