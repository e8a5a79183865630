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
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from rstitch.configs import CONF_DIR
from rstitch.data.prompts import PromptFormat
from rstitch.engines import ModelPair, load_pair
from rstitch.methods.easd import store_calibration, user_calibration_file
from rstitch.methods.spec_stats import greedy_entropies, mean_of_top_fraction
from rstitch.testbed import generate_problems

CALIBRATION_SETS = {"limo": "GAIR/LIMO"}  # --dataset name -> hub id (train split; field "question")


def conf_pair(name: str) -> dict[str, Any]:
    """conf/pair/<name>.yaml with its interpolations (e.g. testbed asset paths) resolved."""
    from omegaconf import OmegaConf

    import rstitch.cli.run  # noqa: F401  (registers the ${testbed_asset:...} resolver)

    path = CONF_DIR / "pair" / f"{name}.yaml"
    if not path.exists():
        sys.exit(f"unknown pair '{name}': {path} not found")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def prompt_format(name: str) -> PromptFormat:
    return PromptFormat(**yaml.safe_load((CONF_DIR / "prompt" / f"{name}.yaml").read_text()))


def validation_prompts(tokenizer, n: int, fmt: PromptFormat | None = None) -> list[list[int]]:
    """The testbed's validation problems rendered as chat prompts."""
    fmt = fmt or PromptFormat()
    return [fmt.encode(tokenizer, p.problem) for p in generate_problems("validation", n)]


def check_calibration_set(dataset: str) -> str:
    """The hub id of a calibration set; an evaluated benchmark or an unknown name exits."""
    if (CONF_DIR / "dataset" / f"{dataset}.yaml").exists():
        sys.exit(f"'{dataset}' is an evaluated benchmark: calibrate on data disjoint from it "
                 f"(--dataset {', '.join(CALIBRATION_SETS)}, or the testbed validation split by default)")
    if dataset not in CALIBRATION_SETS:
        sys.exit(f"unknown calibration set '{dataset}'; valid: {', '.join(CALIBRATION_SETS)}")
    return CALIBRATION_SETS[dataset]


def dataset_prompts(tokenizer, dataset: str, limit: int, fmt: PromptFormat, path: str | None = None) -> list[list[int]]:
    """The first ``limit`` problems of a calibration set, read by the dataset registry (the hub, or
    ``path``: a local copy such as GAIR/LIMO's limo.jsonl)."""
    from rstitch.data import load_dataset_records

    check_calibration_set(dataset)
    return [fmt.encode(tokenizer, record.problem) for record in load_dataset_records(dataset, path=path, limit=limit)]


def calibrate(pair: ModelPair, prompts: list[list[int]], max_new_tokens: int, top_fraction: float) -> dict[str, Any]:
    eos = set(pair.llm.eos_token_ids) | set(pair.slm.eos_token_ids)
    entropies: list[float] = []
    for prompt in tqdm(prompts, desc="target greedy", unit="prompt"):
        entropies += greedy_entropies(pair.llm, prompt, max_new_tokens, eos)
    return {
        "tau_h": mean_of_top_fraction(entropies, top_fraction),
        "slm": pair.slm.name,
        "llm": pair.llm.name,
        "top_fraction": top_fraction,
        "n_prompts": len(prompts),
        "n_positions": len(entropies),
        "max_new_tokens": max_new_tokens,
        "mean_entropy": statistics.fmean(entropies),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="testbed", help="a conf/pair name (ignored with --slm/--llm)")
    parser.add_argument("--slm", help="draft model path (with --llm, instead of --pair)")
    parser.add_argument("--llm", help="target model path")
    parser.add_argument("--pair-name", help="key of the stored entry (default: the --pair name)")
    parser.add_argument("--dataset", help=f"a calibration set: {', '.join(CALIBRATION_SETS)} (default: testbed validation problems)")
    parser.add_argument("--dataset-path", help="a local copy of the --dataset set (JSONL/Parquet), read offline")
    parser.add_argument("--prompt", default="chat", help="a conf/prompt name")
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
        sys.exit("give both --slm and --llm, or neither")
    if args.dataset:
        check_calibration_set(args.dataset)  # before loading any model
    if args.slm:
        pair = load_pair({"path": args.slm}, {"path": args.llm})
        name = args.pair_name or f"{pair.slm.name}+{pair.llm.name}"
    else:
        cfg = conf_pair(args.pair)
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
