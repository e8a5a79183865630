"""Train Arbitrage's router: a small sequence classifier predicting whether the target model
would write a better step than the draft model (delta = PRM(target step) - PRM(draft step) > 0).

    python scripts/train_arbitrage_router.py                  # testbed assets -> assets/arbitrage_router
    python scripts/train_arbitrage_router.py --smoke          # whole pipeline on tiny random models, < 1 minute
    python scripts/train_arbitrage_router.py --data numina \\
        --slm deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --llm deepseek-ai/DeepSeek-R1-Distill-Qwen-7B \\
        --prm skywork --prm-path Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B \\
        --init Qwen/Qwen2.5-0.5B --prompt r1 --device cuda --dtype bfloat16 --out runs/router

Pipeline:
  1. problems: the testbed's train split (held out: its validation split), or AI-MO/NuminaMath-CoT
     (train split; held out: its test split) as in the Arbitrage paper.
  2. paired steps: along each problem, draft and target both write the next step from the same
     prefix, cut as the step-level methods cut steps (separator, EOS, per-step cap, budget); the
     PRM scores both; the trajectory follows the oracle's choice at tau = 0 (`--follow`). This is
     `arbitrage_oracle` run on many problems at once (batched generation, one KV cache per batch).
  3. labels y = 1[delta > 0]; class-balanced downsampling of the training steps.
  4. router: `AutoModelForSequenceClassification` (num_labels=2) from `--init` (testbed: the SLM,
     which shares the tokenizer and already reads the task), fine-tuned with cross-entropy, AdamW,
     linear warmup then linear decay.
  5. held-out evaluation: Spearman rho between y_hat and delta on all held-out steps, and per-class
     accuracy at y_hat > 0.5 -> OUT/router_report.json.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rstitch.config_groups import group_choices, prompt_format
from rstitch.engines import load_pair
from rstitch.engines.base import StopWatcher
from rstitch.engines.hf import cache_kwargs
from rstitch.errors import ConfigError
from rstitch.methods.base import LLM, SLM
from rstitch.methods.steps import step_text
from rstitch.metrics import spearman
from rstitch.rewards import load_prm
from rstitch.routers.arbitrage import encode_router_input
from rstitch.routers.arbitrage_settings import ROUTER_TRAINING_SETTINGS, apply_router_training_settings
from rstitch.testbed import ASSETS_DIR, LLM_DIR, SLM_DIR, generate_problems


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny random models and sizes, < 1 minute")
    p.add_argument("--data", choices=("testbed", "numina"), default="testbed")
    p.add_argument("--out", type=Path, default=None, help="router dir (default: assets/arbitrage_router; smoke: a temp dir)")
    p.add_argument("--slm", default=str(SLM_DIR))
    p.add_argument("--llm", default=str(LLM_DIR))
    p.add_argument("--prm", default="testbed", help="PRM name (rstitch.rewards.PRMS)")
    p.add_argument("--prm-path", default=None)
    p.add_argument("--init", default=None, help="router initialization (default: the SLM)")
    p.add_argument("--prompt", default="chat", choices=group_choices("prompt"), help="conf/prompt/<name>.yaml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    # data
    p.add_argument("--n-train", type=int, default=400, help="training problems")
    p.add_argument("--n-eval", type=int, default=60, help="held-out problems")
    p.add_argument("--minutes-data", type=float, default=9.0, help="cap on the paired-step generation")
    p.add_argument("--max-new-tokens", type=int, default=400)
    p.add_argument("--max-step-tokens", type=int, default=120)
    p.add_argument("--max-steps", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--gen-batch-size", type=int, default=64, help="trajectories generated together")
    p.add_argument("--follow", choices=("oracle", "draft", "target"), default="oracle")
    # optimisation
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-frac", type=float, default=0.1)
    p.add_argument("--max-length", type=int, default=4096, help="router inputs keep their last tokens")
    p.add_argument("--settings", choices=tuple(ROUTER_TRAINING_SETTINGS), default="testbed",
                   help="init, batch size, lr, epochs: paper (from the PRM, 1024, 1e-5, 3) or testbed; flags win")
    args = p.parse_args()
    try:
        apply_router_training_settings(args, {k: p.get_default(k) for k in vars(args)})
    except ConfigError as err:
        p.error(str(err))
    if args.smoke:
        args.n_train, args.n_eval, args.epochs = 5, 2, 2
        args.max_new_tokens, args.max_step_tokens, args.max_steps = 36, 12, 4
    return args


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


T0 = time.time()
FOLLOW_TAU = {"oracle": 0.0, "draft": math.inf, "target": -math.inf}
SEPARATOR = "\n\n"


# ----------------------------------------------------------------------------- 1. problems


def problems(args: argparse.Namespace, held_out: bool) -> list[str]:
    n = args.n_eval if held_out else args.n_train
    if args.data == "testbed":
        return [q.problem for q in generate_problems("validation" if held_out else "train", n, seed=args.seed)]
    from datasets import load_dataset

    rows = load_dataset("AI-MO/NuminaMath-CoT", split="test" if held_out else "train")
    return list(rows.shuffle(seed=args.seed).select(range(min(n, len(rows))))["problem"])


# ----------------------------------------------------------------------------- 2. paired steps


@dataclass
class Example:
    problem: str
    history: list[tuple[int, str]]  # earlier steps: (author, text)
    draft: str
    delta: float  # s_target - s_draft


@dataclass
class Trajectory:
    problem: str
    prompt_ids: list[int]
    output: list[int] = field(default_factory=list)
    history: list[tuple[int, str]] = field(default_factory=list)
    done: bool = False


@torch.no_grad()
def batched_steps(runner, rows: list[list[int]], limits: list[int], eos: set[int], args,
                  generator: torch.Generator) -> list[list[int]]:
    """One step per row, as `StepDecoder.generate` cuts it (separator, EOS or the row's token
    limit), for a batch of rows at once: left padding, one KV cache, greedy or sampled."""
    from transformers import DynamicCache

    model, tokenizer = runner.model, runner.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = cache_kwargs(model, DynamicCache(config=model.config))  # filled in place by each forward
    out = model(input_ids=ids.to(runner.device), attention_mask=mask.to(runner.device),
                position_ids=positions.to(runner.device), use_cache=True, **cache)
    watchers = [StopWatcher(tokenizer, [SEPARATOR]) for _ in rows]
    steps: list[list[int]] = [[] for _ in rows]
    done = [limit <= 0 for limit in limits]
    while not all(done):
        logits = out.logits[:, -1, : runner.vocab_size].float().cpu()
        if args.temperature > 0:
            tokens = torch.multinomial(torch.softmax(logits / args.temperature, -1), 1, generator=generator)[:, 0]
        else:
            tokens = logits.argmax(-1)
        for i, token in enumerate(tokens.tolist()):
            if not done[i]:
                steps[i].append(token)
                done[i] = token in eos or watchers[i].hit(token) or len(steps[i]) >= limits[i]
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=tokens[:, None].to(runner.device), attention_mask=mask.to(runner.device),
                    position_ids=positions.to(runner.device), use_cache=True, **cache)
    return steps


def oracle_round(batch: list[Trajectory], pair, prm, args, generator: torch.Generator) -> list[Example]:
    """Both models write the next step of every trajectory; the PRM scores both; each trajectory
    goes on with the step `--follow` picks."""
    rows = [t.prompt_ids + t.output for t in batch]
    limits = [min(args.max_step_tokens, args.max_new_tokens - len(t.output)) for t in batch]
    eos = set(pair.slm.eos_token_ids) | set(pair.llm.eos_token_ids)
    drafts = batched_steps(pair.slm, rows, limits, eos, args, generator)
    targets = batched_steps(pair.llm, rows, limits, eos, args, generator)
    examples = []
    for t, draft, target in zip(batch, drafts, targets):
        texts = [text for _, text in t.history]
        draft_text, target_text = (step_text(pair.tokenizer.decode(s, skip_special_tokens=True), SEPARATOR) for s in (draft, target))
        gain = prm.score(t.problem, texts + [target_text])[-1] - prm.score(t.problem, texts + [draft_text])[-1]
        examples.append(Example(t.problem, list(t.history), draft_text, gain))
        author, step, text = (LLM, target, target_text) if gain > FOLLOW_TAU[args.follow] else (SLM, draft, draft_text)
        t.output += step
        t.history.append((author, text))
        t.done = bool(set(step) & eos) or len(t.output) >= args.max_new_tokens or len(t.history) >= args.max_steps
    return examples


def paired_steps(args, texts: list[str], pair, prm, minutes: float) -> list[Example]:
    """Examples from whole trajectories, `--gen-batch-size` problems at a time (so a time cap
    keeps later steps in proportion, rather than only the first steps of every problem)."""
    fmt, start = prompt_format(args.prompt), time.time()
    generator = torch.Generator().manual_seed(args.seed)
    examples: list[Example] = []
    for b in range(0, len(texts), args.gen_batch_size):
        if time.time() - start > minutes * 60:
            log(f"  data time cap reached after {b} problems")
            break
        batch = [Trajectory(text, fmt.encode(pair.tokenizer, text)) for text in texts[b: b + args.gen_batch_size]]
        while active := [t for t in batch if not t.done]:
            examples += oracle_round(active, pair, prm, args, generator)
        log(f"  {b + len(batch)} problems, {len(examples)} steps, {np.mean([e.delta > 0 for e in examples]):.2f} positive")
    return examples


def balanced(examples: list[Example], rng: random.Random) -> list[Example]:
    """Downsample the larger class to the size of the smaller one."""
    pos = [e for e in examples if e.delta > 0]
    neg = [e for e in examples if e.delta <= 0]
    k = min(len(pos), len(neg))
    chosen = rng.sample(pos, k) + rng.sample(neg, k)
    rng.shuffle(chosen)
    return chosen


# ----------------------------------------------------------------------------- 3. router


def load_router(init: str, device: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(init)
    model = AutoModelForSequenceClassification.from_pretrained(init, num_labels=2, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return model.to(device), tokenizer


def encode(tokenizer, examples: list[Example], max_length: int) -> list[list[int]]:
    return [encode_router_input(tokenizer, e.problem, e.history, e.draft)[-max_length:] for e in examples]


def batch_tensors(ids: list[list[int]], pad_id: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), n), dtype=torch.long)
    for i, x in enumerate(ids):  # right padding: the classifier pools the last non-pad token
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return input_ids.to(device), mask.to(device)


def train(model, ids: list[list[int]], labels: list[int], args) -> dict:
    order = list(range(len(ids)))
    steps = args.epochs * math.ceil(len(ids) / args.batch_size)
    warmup = max(1, int(args.warmup_frac * steps))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup)))
    rng, step, t0 = random.Random(args.seed), 0, time.time()
    model.train()
    for epoch in range(args.epochs):
        rng.shuffle(order)
        total = 0.0
        for b in range(0, len(order), args.batch_size):
            chunk = order[b: b + args.batch_size]
            input_ids, mask = batch_tensors([ids[i] for i in chunk], model.config.pad_token_id, args.device)
            logits = model(input_ids=input_ids, attention_mask=mask).logits
            loss = F.cross_entropy(logits, torch.tensor([labels[i] for i in chunk], device=args.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total += loss.item() * len(chunk)
            step += 1
        log(f"  epoch {epoch + 1}/{args.epochs}: loss {total / max(1, len(order)):.4f}")
    model.eval()
    return {"steps": step, "minutes": round((time.time() - t0) / 60, 2)}


@torch.no_grad()
def predict(model, ids: list[list[int]], device: str, batch_size: int = 32) -> np.ndarray:
    out = []
    for b in range(0, len(ids), batch_size):
        input_ids, mask = batch_tensors(ids[b: b + batch_size], model.config.pad_token_id, device)
        out += torch.softmax(model(input_ids=input_ids, attention_mask=mask).logits.float(), -1)[:, 1].tolist()
    return np.asarray(out)


# ----------------------------------------------------------------------------- 4. evaluation


def evaluate(y_hat: np.ndarray, deltas: list[float]) -> dict:
    positive = np.asarray(deltas) > 0
    predicted = y_hat > 0.5
    accuracy = lambda mask: float((predicted[mask] == positive[mask]).mean()) if mask.any() else float("nan")  # noqa: E731
    return {
        "n_steps": len(deltas),
        "positive_frac": float(positive.mean()) if len(deltas) else float("nan"),
        "spearman_rho": spearman(y_hat, deltas),
        "accuracy_class0": accuracy(~positive),
        "accuracy_class1": accuracy(positive),
    }


# ----------------------------------------------------------------------------- smoke models


def build_smoke_models(root: Path) -> dict[str, str]:
    """Tiny random SLM, LLM and (likelihood) PRM on the testbed tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rstitch.rewards.likelihood_prm import LikelihoodHead, save_prm
    from rstitch.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer(root / "tokenizer")
    paths = {}
    for seed, name in enumerate(("slm", "llm", "prm")):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, bos_token_id=None)
        if name == "prm":
            save_prm(root / name, LlamaForCausalLM(cfg), tok, LikelihoodHead())
        else:
            LlamaForCausalLM(cfg).save_pretrained(root / name)
            tok.save_pretrained(root / name)
        paths[name] = str(root / name)
    return paths


# ----------------------------------------------------------------------------- main


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if args.smoke:
        paths = build_smoke_models(Path(tempfile.mkdtemp(prefix="router-smoke-models-")))
        args.slm, args.llm, args.prm_path = paths["slm"], paths["llm"], paths["prm"]
    out = args.out or (Path(tempfile.mkdtemp(prefix="router-smoke-")) if args.smoke else ASSETS_DIR / "arbitrage_router")
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    pair = load_pair({"path": args.slm}, {"path": args.llm}, dtype=args.dtype, device=args.device)
    prm_options = {"device": args.device, "dtype": args.dtype} if args.prm != "oracle" else {}
    prm = load_prm(args.prm, **({"path": args.prm_path} if args.prm_path else {}), **prm_options)
    log(f"pair {pair.slm.name} / {pair.llm.name}, PRM {prm.name}")

    log("paired steps: train")
    train_examples = paired_steps(args, problems(args, held_out=False), pair, prm, args.minutes_data)
    log("paired steps: held out")
    eval_examples = paired_steps(args, problems(args, held_out=True), pair, prm, args.minutes_data / 4)
    chosen = balanced(train_examples, rng)
    log(f"{len(train_examples)} train steps ({np.mean([e.delta > 0 for e in train_examples]):.2f} positive) "
        f"-> {len(chosen)} balanced; {len(eval_examples)} held-out steps")
    if not chosen:
        raise SystemExit("no example of one class: generate more problems (--n-train)")

    model, tokenizer = load_router(args.init or args.slm, args.device)
    report["router_params"] = sum(p.numel() for p in model.parameters())
    log(f"router: {type(model).__name__}, {report['router_params'] / 1e6:.3f}M params")
    train_ids = encode(tokenizer, chosen, args.max_length)
    report["train"] = train(model, train_ids, [int(e.delta > 0) for e in chosen], args)
    report["train"].update(n_steps=len(train_examples), n_balanced=len(chosen))

    report["train_eval"] = evaluate(predict(model, train_ids, args.device), [e.delta for e in chosen])
    eval_ids = encode(tokenizer, eval_examples, args.max_length)
    report["held_out"] = evaluate(predict(model, eval_ids, args.device), [e.delta for e in eval_examples])
    log(f"held out: {report['held_out']}")

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    report["minutes"] = round((time.time() - T0) / 60, 2)
    (out / "router_report.json").write_text(json.dumps(report, indent=2))
    log(f"saved router to {out}")


if __name__ == "__main__":
    main()
