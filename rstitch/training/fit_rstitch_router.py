"""R-Stitch+'s router training loop (scripts/train_router.py parses the arguments and calls it;
docs/rstitch-plus.md). Each step decodes a group of routed rollouts per prompt, drops the groups
whose rewards are all equal, and takes DAPO steps on the rest (the pieces are in dapo.py)."""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from rstitch.data import load_dataset_records
from rstitch.data.prompts import PromptFormat
from rstitch.engines import ModelPair
from rstitch.latency.model import LatencyModel
from rstitch.methods.base import LLM
from rstitch.scorers.rstitch_router import RouterConfig, RStitchRouter, load_router
from rstitch.training import dapo
from rstitch.training.dapo import Rollout, RolloutSettings, trajectory_reward

TRAINING_DATA = {"testbed": "the testbed's train split", "dapo": "DAPO-Math-17k (dataset dapo_math)"}


@dataclass(frozen=True)
class TrainSettings:
    """One training run: `batch` prompts per step, `group` rollouts each, `updates` DAPO steps per
    batch, stopping after `steps` steps or before a step that would end past `minutes`."""

    lam: float  # latency penalty per ms
    rollout: RolloutSettings
    batch: int = 32
    group: int = 8
    clip_eps: float = 0.2
    clip_higher: bool = False
    updates: int = 4
    steps: int = 100
    minutes: float = 30.0
    seed: int = 0


def training_problems(data: str, n: int, seed: int, path: str | None = None) -> list[tuple[str, str]]:
    """(problem, gold answer) pairs through the data registry: the testbed's train split, or the
    first `n` of DAPO-Math-17k shuffled with `seed` (`path`: a local copy)."""
    if data == "testbed":
        records = load_dataset_records("testbed", path=path, split="train", n=n, seed=seed)
    elif data == "dapo":
        records = load_dataset_records("dapo_math", path=path, shuffle_seed=seed, limit=n)
    else:
        raise ValueError(f"unknown training data '{data}'; valid: {', '.join(TRAINING_DATA)}")
    return [(r.problem, r.answer) for r in records]


def new_router(pair: ModelPair, init: Path | None = None, init_p_llm: float = 0.5) -> RStitchRouter:
    """The checkpoint at `init`, else a new router whose head starts at P(LLM) = `init_p_llm`."""
    if init is not None:
        return load_router(init)
    router = RStitchRouter(RouterConfig(pair.slm.hidden_size, pair.llm.hidden_size))
    with torch.no_grad():
        router.head.bias.copy_(torch.tensor([0.0, math.log(init_p_llm / (1 - init_p_llm))]))
    return router


def step_rollouts(step: int, batch: list[tuple[str, str]], pair: ModelPair, prompt: PromptFormat, router: RStitchRouter,
                  latency: dict[str, LatencyModel], generator: torch.Generator,
                  settings: TrainSettings) -> tuple[list[Rollout], list[tuple[list[Rollout], torch.Tensor]]]:
    """A group of rollouts per prompt (each with its own token seed), and the informative groups
    with their advantages."""
    all_rollouts: list[Rollout] = []
    kept = []
    for i, (problem, gold) in enumerate(batch):
        prompt_ids = prompt.encode(pair.tokenizer, problem)
        rollouts = [dapo.rollout(prompt_ids, gold, pair, router, latency, generator, settings.rollout,
                            token_seed=settings.seed + 1000 * step + 10 * i + g) for g in range(settings.group)]
        all_rollouts += rollouts
        rewards = torch.tensor([trajectory_reward(r.correct, r.latency_ms, settings.lam) for r in rollouts])
        if dapo.is_informative(rewards) and any(r.decisions for r in rollouts):
            kept.append((rollouts, dapo.group_advantages(rewards)))
    return all_rollouts, kept


def step_row(step: int, rollouts: list[Rollout], kept: int, lam: float, loss: float, info: dict) -> dict[str, Any]:
    """The training curves' row of one step."""
    decisions = [d for r in rollouts for d in r.decisions]
    return {
        "step": step + 1,
        "reward": statistics.fmean(trajectory_reward(r.correct, r.latency_ms, lam) for r in rollouts),
        "accuracy": statistics.fmean(float(r.correct) for r in rollouts),
        "latency_ms": statistics.fmean(r.latency_ms for r in rollouts),
        "llm_token_share": sum(r.tokens_llm for r in rollouts) / max(1, sum(r.tokens for r in rollouts)),
        "tokens": statistics.fmean(r.tokens for r in rollouts),
        "router_decisions": len(decisions) / len(rollouts),
        "router_llm_rate": sum(d.action == LLM for d in decisions) / max(1, len(decisions)),
        "kept_groups": kept,
        "loss": loss,
        **info,
    }


def train_router(router: RStitchRouter, pair: ModelPair, problems: list[tuple[str, str]], prompt: PromptFormat,
                 latency: dict[str, LatencyModel], settings: TrainSettings, lr: float,
                 log: Callable[[dict[str, Any]], None] = lambda row: None) -> list[dict[str, Any]]:
    """Train `router` in place, step by step over `problems`; the rows of the training curves
    (each also handed to `log` as it is made)."""
    start = time.perf_counter()
    width = max(router.config.slm_hidden, router.config.llm_hidden)
    optimizer = torch.optim.AdamW(router.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed)
    history: list[dict[str, Any]] = []
    for step in range(settings.steps):
        if history and (time.perf_counter() - start + statistics.fmean(r["step_time_s"] for r in history)) / 60 > settings.minutes:
            print(f"stopping at step {step}: the {settings.minutes}-minute budget would be exceeded")
            break
        t0 = time.perf_counter()
        router.eval()
        batch = problems[step * settings.batch:(step + 1) * settings.batch]
        rollouts, kept = step_rollouts(step, batch, pair, prompt, router, latency, generator, settings)
        router.train()
        loss, info = math.nan, {"clip_fraction": math.nan, "ratio_mean": math.nan}
        if kept:
            loss, info = dapo.dapo_update(router, optimizer, dapo.decision_batch(kept, width), settings.updates,
                                          settings.clip_eps, dapo.CLIP_HIGHER if settings.clip_higher else None)
        row = {**step_row(step, rollouts, len(kept), settings.lam, loss, info), "step_time_s": time.perf_counter() - t0,
               "elapsed_min": (time.perf_counter() - start) / 60}
        history.append(row)
        log(row)
    router.eval()
    return history


def write_history(history: list[dict], out: Path) -> None:
    """training_log.json and training_log.csv beside the checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_log.json").write_text(json.dumps(history, indent=1) + "\n")
    if history:
        pd.DataFrame(history).to_csv(out / "training_log.csv", index=False, na_rep="nan")


def build_smoke_models(root: Path) -> dict[str, str]:
    """Tiny random SLM, LLM and likelihood PRM on a small testbed tokenizer (no download, a few seconds)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rstitch.scorers.likelihood_prm import LikelihoodHead
    from rstitch.testbed.tokenizer import tokenizer_corpus, train_tokenizer

    tok = train_tokenizer(tokenizer_corpus(n_problems=200), vocab_size=300)
    for seed, (name, layers, hidden) in enumerate((("slm", 1, 32), ("llm", 2, 48), ("prm", 1, 32))):
        torch.manual_seed(seed)
        LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                     num_attention_heads=2, num_key_value_heads=2, eos_token_id=tok.eos_token_id,
                                     pad_token_id=tok.pad_token_id, bos_token_id=None)).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    LikelihoodHead().save(root / "prm")
    return {name: str(root / name) for name in ("slm", "llm", "prm")}


def start_wandb(mode: str, name: str, config: dict) -> Any:
    """A W&B run for the training curves (offline without WANDB_API_KEY), or None for mode off."""
    if mode == "off":
        return None
    import wandb

    run_mode: Any = ("online" if os.environ.get("WANDB_API_KEY") else "offline") if mode == "auto" else mode
    Path("runs").mkdir(exist_ok=True)  # beside rstitch-run's results (results_root)
    return wandb.init(project="rstitch", name=name, mode=run_mode, dir="runs", config=config, reinit="finish_previous")
