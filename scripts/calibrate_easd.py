"""Calibrate EASD's entropy threshold tau_H for a model pair (EASD eqs. 8-10).

The target decodes calibration prompts greedily; its entropy (nats) at every generated position
is collected; tau_H is the mean of the top p (default 5%) of them. The prompts are disjoint from
every evaluated benchmark: the testbed's validation split (the testbed evaluates its test split),
or `--dataset limo`, GAIR/LIMO (817 problems), the calibration set of the EASD paper. An
evaluated benchmark (a conf/dataset name) is refused: calibrating on it tunes tau_H on the test
data. The value is stored under the
pair's name, together with the model names, in the user's calibration file (--out; by default
$RSTITCH_CACHE/easd_calibration.json, RSTITCH_CACHE defaulting to ~/.cache/rstitch), which is where
`method=easd method.tau_h=auto` looks at run time (`method.calibration` names another file).

    python scripts/calibrate_easd.py                         # conf/pair/testbed.yaml, testbed validation split
    python scripts/calibrate_easd.py --pair qwen2.5_math_1.5b_7b --dataset limo --n 64 --prompt qwen_math_cot
    python scripts/calibrate_easd.py --slm PATH --llm PATH --pair-name mine
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from rstitch.config_groups import group_choices, pair_config, prompt_format
from rstitch.engines import load_pair
from rstitch.errors import exit_on_config_error
from rstitch.methods.easd import store_calibration, user_calibration_file
from rstitch.training.easd_calibration import CALIBRATION_SETS, calibrate, check_calibration_set, dataset_prompts, validation_prompts


@exit_on_config_error()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="testbed", choices=group_choices("pair"), help="a conf/pair name (ignored with --slm/--llm)")
    parser.add_argument("--slm", help="draft model path (with --llm, instead of --pair)")
    parser.add_argument("--llm", help="target model path")
    parser.add_argument("--pair-name", help="key of the stored entry (default: the --pair name)")
    parser.add_argument("--dataset", help=f"a calibration set: {', '.join(CALIBRATION_SETS)} (default: testbed validation problems)")
    parser.add_argument("--dataset-path", help="a local copy of the --dataset set (JSONL/Parquet), read offline")
    parser.add_argument("--prompt", default="chat", choices=group_choices("prompt"), help="a conf/prompt name")
    parser.add_argument("--n", type=int, default=64, help="number of validation prompts")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--top-fraction", type=float, default=0.05, help="p of eq. 9")
    parser.add_argument("--out", default=str(user_calibration_file()),
                        help="the calibration file to add the entry to (default: %(default)s; method.calibration reads it)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if bool(args.slm) != bool(args.llm):
        parser.error("give both --slm and --llm, or neither")
    run(args)


def run(args: argparse.Namespace) -> None:
    if args.dataset:
        check_calibration_set(args.dataset)  # before loading any model
    if args.slm:
        pair = load_pair({"path": args.slm}, {"path": args.llm})
        name = args.pair_name or f"{pair.slm.name}+{pair.llm.name}"
    else:
        cfg = pair_config(args.pair)
        pair = load_pair(cfg["slm"], cfg["llm"], dtype=cfg.get("dtype", "float32"), device=cfg.get("device", "cpu"))
        name = args.pair_name or cfg["name"]
    fmt = prompt_format(args.prompt)
    if args.dataset:
        prompts = dataset_prompts(pair.tokenizer, args.dataset, args.n, fmt, args.dataset_path)
    else:
        prompts = validation_prompts(pair.tokenizer, args.n, fmt)
    entry = calibrate(pair, prompts, args.max_new_tokens, args.top_fraction)
    entry["prompts"] = CALIBRATION_SETS[args.dataset] + "/train" if args.dataset else "testbed/validation"
    path = store_calibration(name, entry, Path(args.out))
    print(f"{name}: tau_h = {entry['tau_h']:.4f} nats (top {args.top_fraction:.0%} of {entry['n_positions']} "
          f"target positions; mean entropy {entry['mean_entropy']:.4f}) -> {path}")


if __name__ == "__main__":
    main()
