"""Train R-Stitch+'s router with DAPO on routed rollouts of a model pair.

    python scripts/train_router.py                 # testbed pair on CPU, <= 30 min -> rstitch/testbed/assets/rstitch_router
    python scripts/train_router.py --batch 16 --tau 1e-5 --init-p-llm 0.95 --lr 1e-2 --updates 8 --minutes 25  # the shipped router
    python scripts/train_router.py --smoke         # tiny random models, whole pipeline in < 1 minute
    python scripts/train_router.py --pair r1_1.5b_7b --data dapo --lam 5e-6 --out runs/router_r1   # GPU, DAPO-Math-17k

One step:
  1. take `--batch` prompts; for each, decode a group of G routed rollouts. Low-entropy tokens
     (H <= tau) go to the SLM as in R-Stitch; at every other position the router's action is
     *sampled* from its policy (and recorded with its log-probability and the hidden state it
     read). Tokens are greedy by default, so the routing is the only randomness in a group and
     reward differences inside a group are caused by routing alone (--temperature to change).
  2. reward R = r_acc - lam * r_acc * L_hat, with L_hat the trajectory's latency in ms estimated
     by the per-forward latency model (scripts/profile_latency.py): correct and fast is best, and a
     wrong answer is not made "less wrong" by being fast.
  3. dynamic sampling: groups whose rewards are all equal carry no signal and are dropped.
  4. group-normalized advantages A_i = (R_i - mean) / std, shared by all decisions of rollout i.
  5. `--updates` gradient steps on the DAPO objective: importance ratio clipped symmetrically at
     1 +- clip_eps (0.2; the paper's eq. 8; `--clip-higher` for DAPO's 0.2 / 0.28), summed over
     the router decisions of a group and divided by their number (token-level normalization),
     averaged over groups.

Rollouts decode with the run's budget: `--max-new-tokens` defaults to the `max_new_tokens` of the
config `rstitch-run` would compose with `--overrides` (e.g. `experiment=rstitch_paper_plus`), so
the reward's latency term is computed on the trajectories the evaluation decodes, not truncated
ones.

Lambda: the paper uses 5e-6 per ms for 7B-32B models on GPU, where a correct trajectory takes tens
of seconds, so the penalty is ~0.1 of the accuracy reward. A testbed LLM-only trajectory is
estimated at ~750 ms on CPU; `TESTBED_LAMBDA` = 2.5e-4 makes its penalty ~0.19, so accuracy still
dominates but latency matters.

--init-p-llm: a testbed rollout holds ~150 router decisions, and nearly every SLM choice there
breaks the answer, so a 50/50 router is never right and every group is dropped. Starting at
P(LLM) = 0.95 (close to R-Stitch) makes about half the rollouts correct.

The DAPO pieces (reward, dynamic sampling, advantages, the clipped loss, routed rollouts) are in
rstitch/training/dapo.py and the loop in rstitch/training/fit_rstitch_router.py; this script parses the
arguments and calls them. DAPO-Math-17k is the data registry's `dapo_math`.

Training curves (reward, accuracy, latency, LLM-token share, ...) go to W&B (offline without an
API key; --wandb off to disable) and to training_log.csv / training_log.json beside the checkpoint.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from rstitch.config_groups import group_choices, pair_config, prompt_format
from rstitch.engines import load_pair
from rstitch.errors import exit_on_config_error
from rstitch.latency.model import fit_profile, load_pair_latency, profile_runners
from rstitch.scorers.rstitch_router import save_router
from rstitch.testbed import ASSETS_DIR
from rstitch.training.dapo import CLIP_HIGHER, PAPER_LAMBDA, TESTBED_LAMBDA, RolloutSettings, rollout_budget
from rstitch.training.fit_rstitch_router import (
    TRAINING_DATA,
    TrainSettings,
    build_smoke_models,
    new_router,
    start_wandb,
    train_router,
    training_problems,
    write_history,
)

DEFAULT_ROUTER, DEFAULT_LATENCY_DIR = ASSETS_DIR / "rstitch_router", ASSETS_DIR / "latency"  # the testbed's


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="testbed", choices=group_choices("pair"), help="a conf/pair/*.yaml name")
    p.add_argument("--slm", default=None, help="override the pair's SLM path")
    p.add_argument("--llm", default=None, help="override the pair's LLM path")
    p.add_argument("--device", default=None, help="override the pair's device")
    p.add_argument("--dtype", default=None, help="override the pair's dtype")
    p.add_argument("--prompt", default="chat", choices=group_choices("prompt"), help="a conf/prompt/*.yaml name (r1 for R1 distills)")
    p.add_argument("--data", default="testbed", choices=list(TRAINING_DATA), help=", ".join(f"{k}: {v}" for k, v in TRAINING_DATA.items()))
    p.add_argument("--data-path", default=None, help="a local copy of the training data (e.g. DAPO-Math-17k as .parquet)")
    p.add_argument("--out", type=Path, default=None, help=f"checkpoint dir (default {DEFAULT_ROUTER})")
    p.add_argument("--init", type=Path, default=None, help="start from this router checkpoint")
    p.add_argument("--latency-dir", type=Path, default=DEFAULT_LATENCY_DIR)
    p.add_argument("--smoke", action="store_true", help="tiny random models, a few steps, < 1 minute")
    # DAPO
    p.add_argument("--batch", type=int, default=32, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="rollouts per prompt (G)")
    p.add_argument("--tau", type=float, default=0.001)
    p.add_argument("--lam", type=float, default=None, help=f"latency penalty per ms (default {PAPER_LAMBDA} for dapo, {TESTBED_LAMBDA} for testbed)")
    p.add_argument("--clip-eps", type=float, default=0.2, help="symmetric ratio clip 1 +- eps (eq. 8)")
    p.add_argument("--clip-higher", action="store_true", help=f"DAPO's asymmetric clip: upper eps {CLIP_HIGHER}")
    p.add_argument("--updates", type=int, default=4, help="gradient steps per batch of rollouts")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--init-p-llm", type=float, default=0.5,
                   help="initial P(LLM) of a new router (head bias); near 1 starts close to R-Stitch, whose rollouts are mostly right")
    p.add_argument("--reward", default="accuracy", choices=["accuracy", "latency_only"],
                   help="latency_only treats every rollout as correct (smoke runs: random models are never right)")
    # decoding
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="rollout budget (default: max_new_tokens of the run config composed with --overrides)")
    p.add_argument("--overrides", nargs="*", default=[], help="rstitch-run overrides whose config gives the budget")
    p.add_argument("--temperature", type=float, default=0.0, help="token sampling (0 = greedy; routing is sampled either way)")
    # budget
    p.add_argument("--steps", type=int, default=None, help="DAPO steps (default 100)")
    p.add_argument("--minutes", type=float, default=None,
                   help="stop before a step that would end past this (default 30; none when --steps is given alone, "
                        "so a set number of steps does not depend on the machine's speed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for small models on a shared CPU)")
    p.add_argument("--wandb", default="auto", choices=["auto", "online", "offline", "off"])
    args = p.parse_args()
    if args.minutes is None:
        args.minutes = math.inf if args.steps is not None else 30.0
    if args.steps is None:
        args.steps = 100
    return args


def pair_and_latency(args: argparse.Namespace) -> tuple[dict, object, dict]:
    """The pair's config, the loaded pair and its latency models (fitted on the spot for --smoke)."""
    if args.smoke:
        tmp = Path(tempfile.mkdtemp(prefix="router-smoke-"))
        smoke = build_smoke_models(tmp)
        pair_cfg = {"name": "smoke", "slm": {"path": smoke["slm"]}, "llm": {"path": smoke["llm"]}, "dtype": "float32", "device": "cpu"}
        args.out = args.out or tmp / "router"
        args.batch, args.group, args.steps, args.max_new_tokens = 4, 4, 3, 24
        args.reward = "latency_only"
        args.wandb = "off" if args.wandb == "auto" else args.wandb
    else:
        args.max_new_tokens = rollout_budget(args.max_new_tokens, args.overrides)
        pair_cfg = pair_config(args.pair, args.slm, args.llm)
    args.out = args.out or DEFAULT_ROUTER
    device = args.device or pair_cfg.get("device", "cpu")
    dtype = args.dtype or pair_cfg.get("dtype", "float32")
    pair = load_pair(pair_cfg["slm"], pair_cfg["llm"], dtype=dtype, device=device)
    if args.smoke:
        latency = {k: fit_profile(profile_runners({k: r}, [1, 8, 32], [0, 32, 128], repeats=1)[k], r) for k, r in pair.models().items()}
    else:
        latency = load_pair_latency(args.latency_dir, pair)
        if latency is None:
            sys.exit(f"no latency models for {pair.slm.name}/{pair.llm.name} on {device}/{dtype} in {args.latency_dir}: "
                     f"run scripts/profile_latency.py first")
    return pair_cfg, pair, latency


@exit_on_config_error()
def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    pair_cfg, pair, latency = pair_and_latency(args)
    lam = args.lam if args.lam is not None else (PAPER_LAMBDA if args.data == "dapo" else TESTBED_LAMBDA)
    problems = training_problems(args.data, args.steps * args.batch, args.seed, args.data_path)
    router = new_router(pair, args.init, args.init_p_llm)
    settings = TrainSettings(lam, RolloutSettings(args.tau, args.max_new_tokens, args.temperature, grade_answers=args.reward == "accuracy"),
                             batch=args.batch, group=args.group, clip_eps=args.clip_eps, clip_higher=args.clip_higher,
                             updates=args.updates, steps=args.steps, minutes=args.minutes, seed=args.seed)
    run_config = {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "lam": lam,
                  "pair": pair_cfg.get("name"), "router_parameters": router.num_parameters()}
    wandb_run = start_wandb(args.wandb, f"train_router/{args.out.name}", run_config)
    print(f"router: {router.num_parameters()} parameters (width {router.config.width}); lam {lam}; "
          f"{args.batch} prompts x G={args.group}; {len(problems)} problems")

    def log(row: dict) -> None:
        if wandb_run is not None:
            wandb_run.log({f"train/{k}": v for k, v in row.items() if k != "step"}, step=row["step"])
        print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)

    history = train_router(router, pair, problems, prompt_format(args.prompt), latency, settings, args.lr, log)
    metadata = {"config": run_config, "steps_done": len(history), "final": history[-1] if history else {},
                "latency_models": {k: m.model for k, m in latency.items()}}
    save_router(router, args.out, metadata)
    write_history(history, args.out)
    if wandb_run is not None:
        wandb_run.summary.update(history[-1] if history else {})
        wandb_run.finish()
    print(f"saved router to {args.out} after {len(history)} steps in {(time.perf_counter() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
