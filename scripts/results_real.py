"""Reports of the methods on the real pair (Qwen2.5-Coder-0.5B / 1.5B Instruct, CPU), one folder per
engine and benchmark: docs/reports/real-pair-<engine>-<dataset>/.

    python scripts/results_real.py --engine hf --dataset gsm8k --n 3 --minutes 20   # decode for at most 20 minutes
    python scripts/results_real.py --engine hf --dataset gsm8k --n 3 --render-only  # rewrite README.md from the records

Greedy, budget 512, batch 1, the pair's default prompt. Problems are decoded in order, every row of
a problem one after the other, so each problem's rows are timed together; each finished problem's
records go into the folder at once, and a later call (on any machine, from a fresh clone) goes on
from where the last one stopped, labelling the rows of each sitting (rstitch/cli/report_decode.py).
Commit the folder after each call.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rstitch.cli.report_decode import ReportSpec, decode_report, refresh_page
from rstitch.errors import exit_on_config_error

REPORTS = Path(__file__).resolve().parents[1] / "docs" / "reports"
BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
PAIR = "qwen2.5_coder_0.5b_1.5b"
# (method, {param: value}); the baseline first, then the rows from cheapest to dearest.
ROWS: list[tuple[str, dict]] = [
    ("llm_only", {}), ("slm_only", {}), ("rstitch", {"tau": 0.02}), ("rstitch", {"tau": 0.05}),
    ("specdec", {}), ("easd", {"tau_h": 2.0}), ("specreason", {}), ("rsd", {}),
]
COLUMNS = ["n", "accuracy", "accuracy_diff", "p", "latency", "speedup", "cpu_speedup", "token_ratio", "per_token_ratio",
           "tokens", "slm_tokens", "llm_tokens", "share", "sittings"]
DESCRIPTION = (
    "`pair=qwen2.5_coder_0.5b_1.5b` ([real-pair.md](../../real-pair.md)) on the first problems of a benchmark "
    "record file (`../shared/benchmarks`): greedy, budget 512, batch 1, the pair's default prompt (chat template "
    "and the Qwen math system prompt). Latency is the mean wall clock per problem after warm-up; the wall speedup "
    "is against `llm_only` on the same problems, the CPU-time speedup the same ratio of the decodes' CPU seconds "
    "([analysis.md](../../analysis.md)). ± is one standard error (Δ accuracy: paired with `llm_only`, with the "
    "paired test's p); [ ] are 95% paired bootstrap intervals over the problems.")


def spec(args: argparse.Namespace, rows: list[tuple[str, dict]]) -> ReportSpec:
    methods = f" --methods {args.methods}" if args.methods else ""
    command = (f"python scripts/results_real.py --engine {args.engine} --threads {args.threads} --dataset {args.dataset} "
               f"--n {args.n}{methods} --minutes {args.minutes:g}   # repeated until every problem is decoded")
    overrides = [f"pair={PAIR}", f"engine={args.engine}", f"engine.num_threads={args.threads}", f"dataset={args.dataset}",
                 f"dataset.path={BENCHMARKS / f'{args.dataset}.jsonl'}", f"dataset.limit={args.n}", "max_new_tokens=512"]
    return ReportSpec(title=f"Results on the real pair: {args.dataset}, engine {args.engine}", description=DESCRIPTION,
                      command=command, overrides=overrides, rows=rows, tables=[(args.dataset, rows)], columns=COLUMNS)


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="hf", help="hf | llamacpp | vllm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dataset", default="gsm8k", help="a record file of ../shared/benchmarks (gsm8k, math500, ...)")
    parser.add_argument("--n", type=int, default=3, help="first n problems")
    parser.add_argument("--methods", default=None, help="comma list: only these rows (llm_only is always kept)")
    parser.add_argument("--minutes", type=float, default=20.0, help="decode for at most this long, then stop")
    parser.add_argument("--folder", type=Path, default=None, help="the report folder (default: docs/reports/real-pair-<engine>-<dataset>)")
    parser.add_argument("--render-only", action="store_true", help="decode nothing; rewrite README.md from the records")
    args = parser.parse_args()
    wanted = None if args.methods is None else {"llm_only", *args.methods.split(",")}
    rows = [r for r in ROWS if wanted is None or r[0] in wanted]
    folder = args.folder or REPORTS / f"real-pair-{args.engine}-{args.dataset}"
    if args.render_only:
        refresh_page(folder, spec(args, rows))
    else:
        print(f"decoded {decode_report(folder, spec(args, rows), args.minutes)} problems into {folder}")


if __name__ == "__main__":
    main()
