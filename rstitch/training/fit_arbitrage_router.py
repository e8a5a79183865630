"""Arbitrage's router (scripts/train_arbitrage_router.py calls these; docs/step-level.md): paired
steps labelled y = 1[PRM(target step) > PRM(draft step)], class-balanced, a sequence classifier
fine-tuned on them, and its held-out evaluation (Spearman rho against the PRM gain, per-class accuracy)."""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from rstitch import hub
from rstitch.config_groups import prompt_format
from rstitch.data import load_dataset_records
from rstitch.engines.base import StopWatcher
from rstitch.errors import ConfigError
from rstitch.methods.base import LLM, SLM
from rstitch.methods.steps import step_text
from rstitch.results.uncertainty import spearman
from rstitch.scorers.arbitrage_router import encode_router_input
from rstitch.training.testbed_family import decode_rows, log, padded

NUMINA_MATH = "AI-MO/NuminaMath-CoT"  # the Arbitrage paper's training problems
FOLLOW_TAU = {"oracle": 0.0, "draft": math.inf, "target": -math.inf}
SEPARATOR = "\n\n"


def problems(data: str, n: int, seed: int, held_out: bool) -> list[str]:
    """The testbed's train (held out: validation) split through the data registry, or
    AI-MO/NuminaMath-CoT's train (held out: test) split as in the Arbitrage paper."""
    if data == "testbed":
        return [r.problem for r in load_dataset_records("testbed", split="validation" if held_out else "train", n=n, seed=seed)]
    from datasets import load_dataset

    split = "test" if held_out else "train"
    try:  # the whole split's rows are not made Python objects (hub.read_dataset would): only n problems are
        rows = load_dataset(NUMINA_MATH, split=split)
    except Exception as err:  # noqa: BLE001 - network, cache and auth errors alike: one line
        raise ConfigError(f"cannot load {NUMINA_MATH} split {split} from the hub: {hub.first_line(err)}; "
                          "run once with network to cache it, or train on --data testbed") from None
    return list(rows.shuffle(seed=seed).select(range(min(n, len(rows))))["problem"])


@dataclass(frozen=True)
class LabelSettings:
    """How paired steps are generated (scripts/train_arbitrage_router.py's data options)."""

    prompt: str = "chat"  # a conf/prompt/*.yaml name
    max_new_tokens: int = 400
    max_step_tokens: int = 120
    max_steps: int = 24
    temperature: float = 0.0
    gen_batch_size: int = 64  # trajectories generated together
    follow: str = "oracle"  # which step a trajectory goes on with: oracle | draft | target
    seed: int = 0


@dataclass(frozen=True)
class FitSettings:
    """How the router is fine-tuned: cross-entropy, AdamW, linear warmup then linear decay."""

    epochs: int = 4
    batch_size: int = 16
    lr: float = 5e-4
    warmup_frac: float = 0.1
    device: str = "cpu"
    seed: int = 0


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


def batched_steps(runner, rows: list[list[int]], limits: list[int], eos: set[int], args: LabelSettings,
                  generator: torch.Generator) -> list[list[int]]:
    """One step per row, as `StepDecoder.generate` cuts it (separator, EOS or the row's token
    limit), for a batch of rows at once."""
    pad = runner.tokenizer.pad_token_id if runner.tokenizer.pad_token_id is not None else next(iter(eos))
    watchers = [StopWatcher(runner.tokenizer, [SEPARATOR]) for _ in rows]

    def ended(i: int, step: list[int]) -> bool:
        return len(step) >= limits[i] or bool(step) and (step[-1] in eos or watchers[i].hit(step[-1]))

    return decode_rows(runner.model, rows, pad, ended, args.temperature, generator, runner.vocab_size, runner.device)


def oracle_round(batch: list[Trajectory], pair, prm, args: LabelSettings, generator: torch.Generator) -> list[Example]:
    """Both models write the next step of every trajectory; the PRM scores both; each trajectory
    goes on with the step `follow` picks."""
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


def paired_steps(args: LabelSettings, texts: list[str], pair, prm, minutes: float) -> list[Example]:
    """Examples from whole trajectories, `gen_batch_size` problems at a time (so a time cap
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


def load_router(init: str, device: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(init)
    model = AutoModelForSequenceClassification.from_pretrained(init, num_labels=2, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return model.to(device), tokenizer


def encode(tokenizer, examples: list[Example], max_length: int) -> list[list[int]]:
    return [encode_router_input(tokenizer, e.problem, e.history, e.draft)[-max_length:] for e in examples]


def train(model, ids: list[list[int]], labels: list[int], args: FitSettings) -> dict:
    """Fine-tune `model` on router inputs `ids` with labels y = 1[delta > 0]."""
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
            # right padding: the classifier pools the last non-pad token
            input_ids, mask = padded([ids[i] for i in chunk], model.config.pad_token_id, device=args.device)
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
        input_ids, mask = padded(ids[b: b + batch_size], model.config.pad_token_id, device=device)
        out += torch.softmax(model(input_ids=input_ids, attention_mask=mask).logits.float(), -1)[:, 1].tolist()
    return np.asarray(out)


def evaluate(y_hat: np.ndarray, deltas: list[float]) -> dict:
    """Spearman rho between y_hat and delta, and per-class accuracy at y_hat > 0.5."""
    positive = np.asarray(deltas) > 0
    predicted = y_hat > 0.5
    accuracy = lambda mask: float((predicted[mask] == positive[mask]).mean()) if mask.any() else float("nan")  # noqa: E731
    return {
        "n_steps": len(deltas),
        "positive_frac": float(positive.mean()) if len(deltas) else float("nan"),
        "spearman_rho": spearman(y_hat.tolist(), deltas),
        "accuracy_class0": accuracy(~positive),
        "accuracy_class1": accuracy(positive),
    }

