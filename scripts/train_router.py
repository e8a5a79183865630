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
rstitch/routers/dapo.py; this script is the loop around them.

Training curves (reward, accuracy, latency, LLM-token share, ...) go to W&B (offline without an
API key; --wandb off to disable) and to training_log.csv / training_log.json beside the checkpoint.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rstitch.config_groups import group_choices, pair_config, prompt_format
from rstitch.engines import load_pair
from rstitch.methods.base import LLM
from rstitch.metrics.latency_model import fit_profile, load_pair_latency, profile_runner
from rstitch.routers.dapo import (
    CLIP_HIGHER,
    PAPER_LAMBDA,
    TESTBED_LAMBDA,
    RolloutSettings,
    dapo_update,
    decision_batch,
    group_advantages,
    is_informative,
    rollout,
    rollout_budget,
    trajectory_reward,
)
from rstitch.routers.rstitch_router import RouterConfig, RStitchRouter, load_router, save_router
from rstitch.testbed import ASSETS_DIR

DEFAULT_ROUTER, DEFAULT_LATENCY_DIR = ASSETS_DIR / "rstitch_router", ASSETS_DIR / "latency"  # the testbed's

DAPO_DATASET = "BytedTsinghua-SIA/DAPO-Math-17k"


# ----------------------------------------------------------------------------- data and rollouts

def testbed_problems(n: int, seed: int) -> list[tuple[str, str]]:
    from rstitch.testbed import generate_problems

    return [(p.problem, p.answer) for p in generate_problems("train", n, seed=seed)]


def dapo_math_problems(n: int, seed: int) -> list[tuple[str, str]]:
    """DAPO-Math-17k with its answer-format instructions stripped, so the pair's own prompt format
    (e.g. R1's \\boxed{} instruction) applies."""
    from datasets import load_dataset

    rows = load_dataset(DAPO_DATASET, split="train").shuffle(seed=seed).select(range(n))
    prefix = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.DOTALL)
    suffix = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")
    out = []
    for row in rows:
        text = suffix.sub("", prefix.sub("", row["prompt"][0]["content"]))
        out.append((text.strip(), str(row["reward_model"]["ground_truth"])))
    return out


# ----------------------------------------------------------------------------- setup helpers

def build_smoke_pair(out_dir: Path) -> dict[str, dict[str, str]]:
    """Two tiny random Llamas on a small testbed tokenizer (no download, a few seconds)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rstitch.testbed.tokenizer import tokenizer_corpus, train_tokenizer

    tok = train_tokenizer(tokenizer_corpus(n_problems=200), vocab_size=300)
    paths = {}
    for name, layers, hidden in (("slm", 1, 32), ("llm", 2, 48)):
        torch.manual_seed(len(name) + layers)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=2, num_key_value_heads=2, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, bos_token_id=None)
        LlamaForCausalLM(cfg).save_pretrained(out_dir / name)
        tok.save_pretrained(out_dir / name)
        paths[name] = {"path": str(out_dir / name), "name": f"smoke-{name}"}
    return paths


def start_wandb(mode: str, out: Path, config: dict):
    if mode == "off":
        return None
    import wandb

    if mode == "auto":
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    wandb_dir = Path("runs")  # beside rstitch-run's results (results_root)
    wandb_dir.mkdir(exist_ok=True)
    return wandb.init(project="rstitch", name=f"train_router/{out.name}", mode=mode, dir=str(wandb_dir),
                      config=config, reinit="finish_previous")


# ----------------------------------------------------------------------------- main

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="testbed", choices=group_choices("pair"), help="a conf/pair/*.yaml name")
    p.add_argument("--slm", default=None, help="override the pair's SLM path")
    p.add_argument("--llm", default=None, help="override the pair's LLM path")
    p.add_argument("--device", default=None, help="override the pair's device")
    p.add_argument("--dtype", default=None, help="override the pair's dtype")
    p.add_argument("--prompt", default="chat", choices=group_choices("prompt"), help="a conf/prompt/*.yaml name (r1 for R1 distills)")
    p.add_argument("--data", default="testbed", choices=["testbed", "dapo"], help=f"testbed train split or {DAPO_DATASET}")
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
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--minutes", type=float, default=30.0, help="stop before a step that would end past this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for small models on a shared CPU)")
    p.add_argument("--wandb", default="auto", choices=["auto", "online", "offline", "off"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()

    # --- models, data, latency model
    if args.smoke:
        tmp = Path(tempfile.mkdtemp(prefix="router-smoke-"))
        models = build_smoke_pair(tmp)
        pair_cfg = {"name": "smoke", **models, "dtype": "float32", "device": "cpu"}
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
    lam = args.lam if args.lam is not None else (PAPER_LAMBDA if args.data == "dapo" else TESTBED_LAMBDA)
    problems = (dapo_math_problems if args.data == "dapo" else testbed_problems)(args.steps * args.batch, args.seed)
    prompt = prompt_format(args.prompt)
    if args.smoke:  # profile the tiny models on the spot
        latency = {k: fit_profile(profile_runner(r, [1, 8, 32], [0, 32, 128], repeats=1), r) for k, r in pair.models().items()}
    else:
        latency = load_pair_latency(args.latency_dir, pair)
        if latency is None:
            sys.exit(f"no latency models for {pair.slm.name}/{pair.llm.name} on {device}/{dtype} in {args.latency_dir}: "
                     f"run scripts/profile_latency.py first")

    # --- router and optimizer
    config = RouterConfig(pair.slm.hidden_size, pair.llm.hidden_size)
    router = load_router(args.init) if args.init else RStitchRouter(config)
    if not args.init:
        with torch.no_grad():
            router.head.bias.copy_(torch.tensor([0.0, math.log(args.init_p_llm / (1 - args.init_p_llm))]))
    width = max(config.slm_hidden, config.llm_hidden)
    optimizer = torch.optim.AdamW(router.parameters(), lr=args.lr, weight_decay=0.0)
    settings = RolloutSettings(args.tau, args.max_new_tokens, args.temperature, grade_answers=args.reward == "accuracy")
    generator = torch.Generator().manual_seed(args.seed)
    run_config = {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "lam": lam,
                  "pair": pair_cfg.get("name"), "router_parameters": router.num_parameters()}
    wandb_run = start_wandb(args.wandb, args.out, run_config)
    print(f"router: {router.num_parameters()} parameters (width {router.config.width}); lam {lam}; "
          f"{args.batch} prompts x G={args.group}; {len(problems)} problems")

    # --- training loop
    history: list[dict] = []
    step_times: list[float] = []
    for step in range(args.steps):
        elapsed_min = (time.perf_counter() - t_start) / 60
        if step_times and elapsed_min + statistics.fmean(step_times) / 60 > args.minutes:
            print(f"stopping at step {step}: the {args.minutes}-minute budget would be exceeded")
            break
        t0 = time.perf_counter()
        router.eval()
        batch = problems[step * args.batch:(step + 1) * args.batch]
        all_rollouts, kept = [], []
        for i, (problem, gold) in enumerate(batch):
            prompt_ids = prompt.encode(pair.tokenizer, problem)
            rollouts = [rollout(prompt_ids, gold, pair, router, latency, generator, settings, token_seed=args.seed + 1000 * step + 10 * i + g)
                        for g in range(args.group)]
            all_rollouts += rollouts
            rewards = torch.tensor([trajectory_reward(r.correct, r.latency_ms, lam) for r in rollouts])
            if is_informative(rewards) and any(r.decisions for r in rollouts):
                kept.append((rollouts, group_advantages(rewards)))

        # --- DAPO update on the kept groups
        router.train()
        info = {"clip_fraction": math.nan, "ratio_mean": math.nan}
        loss_value = math.nan
        if kept:
            loss_value, info = dapo_update(router, optimizer, decision_batch(kept, width), args.updates,
                                           args.clip_eps, CLIP_HIGHER if args.clip_higher else None)
        step_times.append(time.perf_counter() - t0)

        # --- log
        decisions = [d for r in all_rollouts for d in r.decisions]
        row = {
            "step": step + 1,
            "reward": statistics.fmean(trajectory_reward(r.correct, r.latency_ms, lam) for r in all_rollouts),
            "accuracy": statistics.fmean(float(r.correct) for r in all_rollouts),
            "latency_ms": statistics.fmean(r.latency_ms for r in all_rollouts),
            "llm_token_share": sum(r.tokens_llm for r in all_rollouts) / max(1, sum(r.tokens for r in all_rollouts)),
            "tokens": statistics.fmean(r.tokens for r in all_rollouts),
            "router_decisions": len(decisions) / len(all_rollouts),
            "router_llm_rate": sum(d.action == LLM for d in decisions) / max(1, len(decisions)),
            "kept_groups": len(kept),
            "loss": loss_value,
            **info,
            "step_time_s": step_times[-1],
            "elapsed_min": (time.perf_counter() - t_start) / 60,
        }
        history.append(row)
        if wandb_run is not None:
            wandb_run.log({f"train/{k}": v for k, v in row.items() if k != "step"}, step=step + 1)
        print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)

    # --- save checkpoint and curves
    metadata = {"config": run_config, "steps_done": len(history), "final": history[-1] if history else {},
                "latency_models": {k: m.model for k, m in latency.items()}}
    save_router(router.eval(), args.out, metadata)
    write_history(history, args.out)
    if wandb_run is not None:
        wandb_run.summary.update(history[-1] if history else {})
        wandb_run.finish()
    print(f"saved router to {args.out} after {len(history)} steps in {(time.perf_counter() - t_start) / 60:.1f} min")


def write_history(history: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_log.json").write_text(json.dumps(history, indent=1) + "\n")
    if history:
        with open(out / "training_log.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(history[0]))
            writer.writeheader()
            writer.writerows(history)


if __name__ == "__main__":
    main()
