"""The testbed report (docs/reports/testbed/): accuracy-latency points of every method on the
embedded testbed pair, regenerated from the records the folder keeps.

    python scripts/results_testbed.py --n 20 --minutes 10    # decode for at most 10 minutes, resumable
    python scripts/results_testbed.py --render-only          # rewrite README.md from the records

Problems are decoded in order, every row of a problem one after the other (test split, greedy,
budget 512, batch 1, one torch thread); each finished problem's records go into the folder at once,
so a later call, on this machine or a fresh clone, goes on where this one stopped
(rstitch/cli/report_decode.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rstitch.cli.report_decode import ReportSpec, decode_report, refresh_page
from rstitch.errors import exit_on_config_error

FOLDER = Path(__file__).resolve().parents[1] / "docs" / "reports" / "testbed"

# family -> [(method, {param: value})]; the baselines open every table.
GRID: dict[str, list[tuple[str, dict]]] = {
    "token": [
        *[("rstitch", {"tau": t}) for t in (0.001, 0.005, 0.01, 0.02, 0.03, 0.05)],
        *[("random", {"p": p}) for p in (0.1, 0.3, 0.5, 0.7, 0.9)],
        ("rstitch_plus", {"tau": 0.001}),
    ],
    "speculative": [("specdec", {}), ("easd", {})],
    "step": [
        *[("rsd", {"delta": d}) for d in (0.3, 0.5, 0.7, 0.9)],
        *[("specreason", {"threshold": t}) for t in (3, 5, 7, 9)],
        ("specreason_decode", {"threshold": 7}),
        *[("arbitrage", {"tau": t}) for t in (0.3, 0.5, 0.7, 0.9)],
        *[("arbitrage_oracle", {"tau": t}) for t in (0.0, 0.2)],
    ],
}
BASELINES: list[tuple[str, dict]] = [("llm_only", {}), ("slm_only", {})]
EXTRA = {"token": "switches", "speculative": "spec_acceptance", "step": "acceptance"}
COLUMNS = ["n", "accuracy", "accuracy_diff", "p", "latency", "speedup", "cpu_speedup", "token_ratio", "per_token_ratio",
           "share", "tokens", "switches", "spec_acceptance", "acceptance", "gflops", "sittings"]
DESCRIPTION = (
    "The embedded testbed pair (`pair=testbed`, [testbed.md](../../testbed.md)): test split, greedy, budget 512, "
    "batch 1, one torch thread. Latency is the mean wall clock per problem after warm-up; the wall speedup is "
    "against `llm_only` on the same problems, the CPU-time speedup the same ratio of the decodes' CPU seconds, "
    "which other jobs on the cores change less ([analysis.md](../../analysis.md)). ± is one standard error "
    "(Δ accuracy: paired with `llm_only`, with the paired test's p); [ ] are 95% paired bootstrap intervals over "
    "the problems, which resample problems, not repeated timings. GFLOPs per problem count every model run.")


def spec(n: int, minutes: float) -> ReportSpec:
    rows = BASELINES + [row for family in GRID.values() for row in family]
    return ReportSpec(
        title="Results on the testbed", description=DESCRIPTION,
        command=f"python scripts/results_testbed.py --n {n} --minutes {minutes:g}   # repeated until every problem is decoded",
        overrides=[f"dataset.limit={n}", f"dataset.n={n}", "engine.num_threads=1"], rows=rows,
        tables=[(family, BASELINES + GRID[family]) for family in GRID], columns=COLUMNS)


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20, help="first n test problems")
    parser.add_argument("--minutes", type=float, default=10.0, help="decode for at most this long, then stop")
    parser.add_argument("--folder", type=Path, default=FOLDER, help="the report folder")
    parser.add_argument("--render-only", action="store_true", help="decode nothing; rewrite README.md from the records")
    args = parser.parse_args()
    if args.render_only:
        refresh_page(args.folder, spec(args.n, args.minutes))
    else:
        decoded = decode_report(args.folder, spec(args.n, args.minutes), args.minutes)
        print(f"decoded {decoded} problems into {args.folder}")


if __name__ == "__main__":
    main()
