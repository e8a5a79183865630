"""Token consistency of a small/large pair (R-Stitch, figure 1a).

Along each LLM-only greedy trace, the fraction of positions where the SLM's greedy token, given
the same prefix, equals the LLM's token. One SLM forward scores a whole trace. Printed per
dataset: pooled over all positions, and the mean of the per-sample fractions.

    python scripts/token_consistency.py                                 # testbed pair, testbed test split
    python scripts/token_consistency.py --dataset testbed math500 --limit 50 --option split=validation
    python scripts/token_consistency.py --pair-slm PATH --pair-llm PATH --pair-name r1_1.5b_7b \\
        --dataset math500 --prompt r1 --max-new-tokens 4096
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from rstitch.config_groups import group_choices, prompt_format
from rstitch.data import load_dataset_records
from rstitch.engines import ModelPair, load_pair
from rstitch.errors import exit_on_config_error
from rstitch.methods.spec_stats import greedy_consistency
from rstitch.testbed import ASSETS_DIR


def problems(dataset: str, limit: int | None, options: dict[str, Any]) -> list[str]:
    return [r.problem for r in load_dataset_records(dataset, limit=limit, **options)]


def consistency(pair: ModelPair, prompts: list[list[int]], max_new_tokens: int, label: str) -> dict[str, float]:
    per_sample: list[tuple[int, int]] = []
    for prompt in tqdm(prompts, desc=label, unit="sample"):
        per_sample.append(greedy_consistency(pair, prompt, max_new_tokens))
    matches = sum(m for m, _ in per_sample)
    positions = sum(n for _, n in per_sample)
    return {
        "samples": len(per_sample),
        "positions": positions,
        "pooled": matches / positions if positions else float("nan"),
        "mean_per_sample": statistics.fmean(m / n for m, n in per_sample if n) if positions else float("nan"),
    }


def parse_options(pairs: list[str]) -> dict[str, Any]:
    options = {}
    for item in pairs:
        key, _, value = item.partition("=")
        options[key] = yaml.safe_load(value)  # "300" -> 300, "null" -> None
    return options


@exit_on_config_error()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair-slm", default=str(ASSETS_DIR / "slm"))
    parser.add_argument("--pair-llm", default=str(ASSETS_DIR / "llm"))
    parser.add_argument("--pair-name", default="testbed", help="label for the printed rows")
    parser.add_argument("--dataset", nargs="+", default=["testbed"])
    parser.add_argument("--limit", type=int, default=50, help="samples per dataset")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="dataset option, e.g. split=validation (repeatable)")
    parser.add_argument("--prompt", default="chat", choices=group_choices("prompt"), help="a conf/prompt name")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for path in (args.pair_slm, args.pair_llm):
        if not Path(path).is_dir():
            sys.exit(f"model directory not found: {path}")
    pair = load_pair({"path": args.pair_slm}, {"path": args.pair_llm})
    fmt = prompt_format(args.prompt)
    options = parse_options(args.option)
    rows = []
    for dataset in args.dataset:
        prompts = [fmt.encode(pair.tokenizer, p) for p in problems(dataset, args.limit, options)]
        rows.append((dataset, consistency(pair, prompts, args.max_new_tokens, dataset)))
    print(f"\n{'pair':16s} {'dataset':14s} {'samples':>8s} {'positions':>10s} {'consistency':>12s} {'per-sample':>11s}")
    for dataset, r in rows:
        print(f"{args.pair_name:16s} {dataset:14s} {r['samples']:8d} {r['positions']:10d} "
              f"{r['pooled']:12.4f} {r['mean_per_sample']:11.4f}")


if __name__ == "__main__":
    main()
