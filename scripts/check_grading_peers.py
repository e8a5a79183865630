"""Print the grader's agreement with the peers' answer-equivalence test cases, next to
math-verify's own agreement on the same cases (docs/grading.md, "Agreement with peer graders").

    python scripts/check_grading_peers.py [--cases tests/fixtures/grading_peers.jsonl] [--no-math-verify] [--timeout-s 5]
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rstitch.errors import exit_on_config_error
from rstitch.grading.peer_check import Agreement, load_cases, math_verify_verdict, our_verdict, report

DEFAULT_CASES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "grading_peers.jsonl"


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES, help="the cases file (JSONL)")
    parser.add_argument("--no-math-verify", action="store_true", help="grade with rstitch only")
    parser.add_argument("--timeout-s", type=float, default=5.0,
                        help="rstitch's limit per comparison (the runner's default: 5; a loaded machine may need more)")
    args = parser.parse_args()
    if not args.cases.is_file():
        print(f"check_grading_peers: error: no cases file {args.cases}", file=sys.stderr)
        sys.exit(2)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its warnings about disabled timeouts
    cases = load_cases(args.cases)
    results = [Agreement("rstitch", {case.id: our_verdict(case, timeout_s=args.timeout_s) for case in cases})]
    if not args.no_math_verify:
        results.append(Agreement("math-verify", {case.id: math_verify_verdict(case) for case in cases}))
    print(report(cases, results))


if __name__ == "__main__":
    main()
