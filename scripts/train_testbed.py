"""Train the testbed model family: shared tokenizer, SLM, LLM (+ judge), PRM.

Readable top to bottom, deterministic (fixed seeds, step-count schedules):

    python scripts/train_testbed.py                      # full run into rstitch/testbed/assets
    python scripts/train_testbed.py --smoke --out /tmp/x # whole pipeline on tiny sizes, < 1 minute

Pipeline:
  1. tokenizer: byte-level BPE on the task corpus           -> OUT/tokenizer
  2. SLM: 2-layer Llama on prompt + concise solution + eos  -> OUT/slm
  3. sample the SLM on training problems (real, labelled mistakes for the judge and the PRM)
  4. LLM: deep Llama on prompt + verbose solution + eos, plus ~20% SpecReason judge
     examples (conversation + JUDGE_PREFIX -> one digit, 9 = correct step, 0 = wrong)  -> OUT/llm
  5. sample the LLM on training problems; solve greedily problems with operands a little past the
     training range, where it errs the way it errs on test problems (`stretch_samples`)
  6. PRM: the LLM read through its own predictions (`rstitch.rewards.likelihood_prm`): a logistic
     head on the lowest probability it gives a written digit or operator, fitted on step-checker
     labels of both models' solutions and of corrupted ones  -> OUT/prm (the head; it reads OUT/llm)
  7. validation: greedy accuracy / output length of SLM and LLM, judge and PRM ROC-AUC -> OUT/train_report.json

``--steps-slm/llm`` fix the number of optimizer steps and the learning-rate schedule, so a run is
exactly reproducible (tests/test_testbed_train_smoke.py trains twice and compares the weights).
``--minutes-*`` are safety caps on each phase's wall time, set well above what the default step
counts take on a 2-core CPU; a phase that hits one stops early, undecayed, and the run then
depends on the machine's speed (``--schedule-by-time`` decays by the cap instead).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from rstitch.engines.hf import cache_kwargs
from rstitch.methods.specreason import digit_ids, judge_prompt
from rstitch.metrics import roc_auc
from rstitch.rewards.likelihood_prm import (
    CheckedLogProbs,
    CheckedValues,
    LikelihoodHead,
    encode_prm_input,
    fit_head,
    step_features,
)
from rstitch.testbed import (
    ASSETS_DIR,
    STEP_SEPARATOR,
    Difficulty,
    TestbedProblem,
    check_steps,
    corrupt_steps,
    extract_boxed,
    generate_problems,
    split_steps,
)
from rstitch.testbed.tokenizer import build_tokenizer, load_tokenizer, render_prompt

# ----------------------------------------------------------------------------- config

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--out", type=Path, default=None, help="output dir (default: the package assets dir; with --smoke: a temp dir)")
p.add_argument("--smoke", action="store_true", help="tiny sizes and steps, whole pipeline in < 1 minute")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
               help="torch threads (default: all cores; on the idle 2-core machine 2 threads train the LLM 1.7x faster "
                    "than 1, but use 1 when another job shares the machine; bit-for-bit reproducibility is tested at 1 and was checked at 2)")
p.add_argument("--data-seed", type=int, default=None, help="seed of the training-problem stream (default: --seed)")
p.add_argument("--only", default="slm,llm,prm", help="comma list of phases to train (the others are loaded from --out)")
p.add_argument("--init-llm", type=Path, default=None, help="start the LLM from this checkpoint instead of a fresh init")
# model sizes
p.add_argument("--slm-layers", type=int, default=2)
p.add_argument("--slm-hidden", type=int, default=64)
p.add_argument("--llm-layers", type=int, default=10)
p.add_argument("--llm-hidden", type=int, default=112)
# optimisation
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--lr", type=float, default=2e-3)
p.add_argument("--steps-slm", type=int, default=1500)
p.add_argument("--steps-llm", type=int, default=5500)
p.add_argument("--minutes-slm", type=float, default=10.0)
p.add_argument("--minutes-llm", type=float, default=75.0)
p.add_argument("--schedule-by-time", action="store_true",
               help="decay the learning rate by the time cap too when it is further along than the step count "
                    "(the run then depends on the machine's speed)")
p.add_argument("--judge-frac", type=float, default=0.2, help="fraction of LLM examples in the judge format")
p.add_argument("--stitch-frac", type=float, default=0.3,
               help="fraction of SLM/LLM examples that continue a solution begun in the other model's style")
p.add_argument("--tokenizer", type=Path, default=None, help="use this tokenizer instead of training one (with --init-*)")
p.add_argument("--init-slm", type=Path, default=None, help="start the SLM from this checkpoint instead of a fresh init")
p.add_argument("--sample-slm", type=int, default=8192, help="training problems sampled from the SLM for judge/PRM data")
p.add_argument("--sample-llm", type=int, default=1024, help="training problems sampled from the LLM for PRM data")
p.add_argument("--stretch-llm", type=int, default=1024,
               help="greedy LLM solutions of training problems with operands up to 70, past the training range, for PRM data")
p.add_argument("--prm-solutions", type=int, default=4096,
               help="labelled solutions the PRM head is fitted on: half real samples of both models, half clean or corrupted")
p.add_argument("--eval-n", type=int, default=200, help="validation problems for the final evaluation")
p.add_argument("--max-new-concise", type=int, default=120)
p.add_argument("--max-new-verbose", type=int, default=400)
p.add_argument("--eval-every", type=int, default=0, help="quick validation eval every N steps (0: off)")
args = p.parse_args()
if (llm_frac_sum := args.judge_frac + args.stitch_frac) > 1:
    p.error(f"--judge-frac + --stitch-frac is {llm_frac_sum:g}; they share the LLM's examples and must sum to at most 1")

if args.smoke:
    args.slm_hidden, args.llm_hidden, args.llm_layers = 32, 48, 3
    args.steps_slm, args.steps_llm = 12, 12
    args.sample_slm, args.sample_llm, args.stretch_llm, args.prm_solutions, args.eval_n = 16, 8, 8, 32, 8
    args.max_new_concise, args.max_new_verbose = 30, 40
    args.threads = 1
if args.out is None:
    args.out = Path(tempfile.mkdtemp(prefix="testbed-smoke-")) if args.smoke else ASSETS_DIR
OUT: Path = args.out
OUT.mkdir(parents=True, exist_ok=True)
PHASES = set(args.only.split(","))

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
random.seed(args.seed)
np.random.seed(args.seed)
torch.use_deterministic_algorithms(True, warn_only=True)
T0 = time.time()
REPORT: dict = {"args": {k: str(v) for k, v in vars(args).items()}}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- 1. tokenizer

if args.tokenizer is not None:  # continuing from checkpoints: keep their token ids
    tok = load_tokenizer(args.tokenizer)
    tok.save_pretrained(str(OUT / "tokenizer"))
else:
    tok = build_tokenizer(OUT / "tokenizer")
EOS, PAD = tok.eos_token_id, tok.pad_token_id
DIGIT_IDS = digit_ids(tok)  # the judge's answers "0".."9", each a single token (checked)
log(f"tokenizer: vocab {len(tok)}")

TRAIN_DIFFICULTY = Difficulty()  # the default "medium" mix: 1-6 ops, start and operands <= 50
STRETCH_DIFFICULTY = Difficulty(max_start=70, max_operand=70)


PHASE_STREAM = {"slm": 0, "llm": 1, "prm": 2}


def problem_stream(seed: int, phase: str):
    """Endless deterministic stream of training problems, one per phase: a phase sees the same
    problems whether the phases before it ran in this process or were loaded (`--only`)."""
    chunk, base = 0, PHASE_STREAM[phase] * 1_000_000 + seed * 1000
    while True:
        yield from generate_problems("train", 4096, seed=base + chunk, difficulty=TRAIN_DIFFICULTY)
        chunk += 1


# ----------------------------------------------------------------------------- examples


def lm_example(prob: TestbedProblem, style: str) -> tuple[list[int], list[int]]:
    """prompt + solution + eos; loss on the solution and eos only."""
    prompt = tok.encode(render_prompt(tok, prob.problem), add_special_tokens=False)
    target = tok.encode(prob.solution(style), add_special_tokens=False) + [EOS]
    return prompt + target, [-100] * len(prompt) + target


def stitched_example(prob: TestbedProblem, style: str, rng: random.Random) -> tuple[list[int], list[int]]:
    """A solution begun by the other model, cut at any token, continued by a model of `style`.

    R-Stitch hands single tokens between the models mid-step, so each model must continue the
    other's text wherever it stops. The LLM ("verbose") continues concise text concisely: it
    adapts to the text it is given, so a stitched solution keeps one style. The SLM ("concise")
    finishes a verbose step as written, then goes on concisely. Loss on the continuation only.
    """
    if style == "verbose":
        text, cut_lo, cut_hi = prob.solution("concise"), 1, None
    else:
        verbose = prob.steps("verbose")
        i = rng.randrange(len(verbose))  # step the cut falls in: 0 opening, 1..n operations, n+1 closing
        concise_rest = prob.steps("concise")[i:] if i <= len(prob.ops) else []
        head = STEP_SEPARATOR.join(verbose[: i + 1])
        cut_lo = len(STEP_SEPARATOR.join(verbose[:i])) + (len(STEP_SEPARATOR) if i else 0)
        cut_hi = len(head)
        text = STEP_SEPARATOR.join([head, *concise_rest])
    prompt = tok.encode(render_prompt(tok, prob.problem), add_special_tokens=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = [a for a, _ in enc["offset_mapping"]]
    hi = len(text) if cut_hi is None else cut_hi
    cuts = [j for j, a in enumerate(starts) if j >= 1 and cut_lo <= a < hi] or [len(starts)]
    cut = rng.choice(cuts)
    body = enc["input_ids"] + [EOS]
    return prompt + body, [-100] * (len(prompt) + cut) + body[cut:]


def mixed_steps(prob: TestbedProblem, rng: random.Random, corrupt: bool) -> list[str]:
    """Steps in concise, verbose or mixed style (mixed: each operation step
    picked from one style), optionally with one injected (propagated) error (corrupt_steps)."""
    style = rng.choice(["concise", "verbose", "mixed"])
    if corrupt:
        state = rng.random()
        c = corrupt_steps(prob, "concise", random.Random(state))
        v = corrupt_steps(prob, "verbose", random.Random(state))
    else:
        c, v = prob.steps("concise"), prob.steps("verbose")
    if style == "concise":
        return c
    if style == "verbose":
        return v
    # c = [op1..opn, box]; v = [start, op1..opn, final]
    steps = [v[0]] if rng.random() < 0.5 else []
    for i in range(len(prob.ops)):
        steps.append(c[i] if rng.random() < 0.5 else v[i + 1])
    steps.append(c[-1] if rng.random() < 0.5 else v[-1])
    return steps


def labelled_sample(prob: TestbedProblem, rng: random.Random, pools: list[list]) -> tuple[TestbedProblem, list[str], list[bool]]:
    """(problem, steps, per-step labels): half corrupted/clean templates, the rest real samples
    of the trained models, each model's pool equally often (the LLM's rare mistakes are the
    ones a PRM misses first)."""
    pools = [pool for pool in pools if pool]
    if pools and rng.random() < 0.5:
        pool = pools[rng.randrange(len(pools))]
        prob, steps = pool[rng.randrange(len(pool))]
    else:
        steps = mixed_steps(prob, rng, corrupt=rng.random() < 0.6)
    return prob, steps, check_steps(prob, steps)


def judge_example(prob: TestbedProblem, rng: random.Random, sampled: list) -> tuple[list[int], list[int]]:
    """SpecReason judge: [problem, steps so far, instruction] + prefix -> one digit."""
    prob, steps, labels = labelled_sample(prob, rng, [sampled])
    if not steps:
        steps, labels = prob.steps("concise"), [True] * (len(prob.ops) + 1)
    wrong = [i for i, ok in enumerate(labels) if not ok]
    # half of the time rate the first wrong step (the informative case), else a random step
    t = wrong[0] if wrong and rng.random() < 0.5 else rng.randrange(len(steps))
    prompt = tok.encode(judge_prompt(tok, prob.problem, steps[: t + 1], STEP_SEPARATOR), add_special_tokens=False)
    digit = DIGIT_IDS[9] if labels[t] else DIGIT_IDS[0]
    return prompt + [digit], [-100] * len(prompt) + [digit]


def collate(batch: list[tuple[list[int], list[int]]]):
    n = max(len(x) for x, _ in batch)
    ids = torch.full((len(batch), n), PAD, dtype=torch.long)
    lab = torch.full((len(batch), n), -100, dtype=torch.long)
    att = torch.zeros((len(batch), n), dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        lab[i, : len(y)] = torch.tensor(y)
        att[i, : len(x)] = 1
    return ids, lab, att


def bucketed(make_example, batch_size: int, rng: random.Random, pool: int = 8):
    """Batches of similar length: draw pool*batch_size examples, sort by length, shuffle the batches."""
    while True:
        exs = sorted((make_example() for _ in range(pool * batch_size)), key=lambda e: len(e[0]))
        batches = [exs[i : i + batch_size] for i in range(0, len(exs), batch_size)]
        rng.shuffle(batches)
        yield from batches


# ----------------------------------------------------------------------------- models


def llama_config(layers: int, hidden: int, **kw) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,  # vLLM's CPU attention takes head sizes 32, 64, 80, ... (not hidden / 4)
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=EOS,
        pad_token_id=PAD,
        **kw,
    )


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, total: int, base: float, time_frac: float = 0.0, warmup: int = 100) -> float:
    """Linear warmup, then cosine decay to 10% over the run. The run's progress is the step
    fraction, or with --schedule-by-time the larger of it and the fraction of the time cap used
    (a phase that hits its time cap then still ends decayed, but depends on the machine's speed)."""
    warmup = min(warmup, max(1, total // 10))
    if step < warmup:
        return base * (step + 1) / warmup
    frac = max((step - warmup) / max(1, total - warmup), time_frac)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def train_loop(model, batches, steps: int, minutes: float, name: str, loss_fn, eval_fn=None, lr: float | None = None) -> dict:
    lr = args.lr if lr is None else lr
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    t0, ema, step = time.time(), None, 0
    for step in range(steps):
        time_frac = (time.time() - t0) / (minutes * 60)
        if time_frac > 1:
            log(f"{name}: time cap reached at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, time_frac if args.schedule_by_time else 0.0)
        loss = loss_fn(model, next(batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 100 == 0 or step == steps - 1:
            log(f"{name} step {step}/{steps} loss {ema:.4f} lr {opt.param_groups[0]['lr']:.2e}")
        if eval_fn and args.eval_every and step and step % args.eval_every == 0:
            model.eval()
            eval_fn(model)
            model.train()
    model.eval()
    return {"steps": step + 1, "minutes": round((time.time() - t0) / 60, 2)}


def lm_loss(model, batch):
    ids, lab, att = collate(batch)
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), lab[:, 1:].reshape(-1), ignore_index=-100)


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def generate(model, problems: list[TestbedProblem], max_new: int, temperature: float = 0.0, seed: int = 0, bs: int = 64,
             prefixes: list[str] | None = None):
    """Greedy (or sampled) decoding with the KV cache; returns decoded completions (each
    continuing its `prefixes` entry, the solution text already written, if given)."""
    tok.padding_side = "left"
    outs = []
    g = torch.Generator().manual_seed(seed)
    prefixes = prefixes or [""] * len(problems)
    for i in range(0, len(problems), bs):
        chunk = problems[i : i + bs]
        prompts = [render_prompt(tok, q.problem) + pre for q, pre in zip(chunk, prefixes[i : i + bs])]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids, att = enc["input_ids"], enc["attention_mask"]
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        cache = cache_kwargs(model, DynamicCache(config=model.config))  # filled in place by each forward
        logits = model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True, **cache).logits[:, -1]
        done = torch.zeros(len(chunk), dtype=torch.bool)
        gen = []
        for _ in range(max_new):
            if temperature > 0:
                nxt = torch.multinomial(F.softmax(logits / temperature, -1), 1, generator=g).squeeze(1)
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
            gen.append(nxt)
            done |= nxt == EOS
            if done.all():
                break
            att = torch.cat([att, torch.ones(len(chunk), 1, dtype=att.dtype)], 1)
            pos = pos[:, -1:] + 1
            logits = model(input_ids=nxt[:, None], attention_mask=att, position_ids=pos, use_cache=True, **cache).logits[:, -1]
        gen_ids = torch.stack(gen, 1).tolist()
        for row in gen_ids:
            row = [t for t in row if t != PAD]
            if EOS in row:
                row = row[: row.index(EOS)]
            outs.append(tok.decode(row))
    tok.padding_side = "right"
    return outs


def accuracy(model, problems, max_new: int) -> dict:
    t0 = time.time()
    texts = generate(model, problems, max_new)
    acc = float(np.mean([extract_boxed(t) == q.answer for t, q in zip(texts, problems)]))
    ntok = float(np.mean([len(tok.encode(t, add_special_tokens=False)) + 1 for t in texts]))
    return {"accuracy": acc, "mean_output_tokens": ntok, "n": len(problems), "seconds": round(time.time() - t0, 1), "texts": texts}


VAL = generate_problems("validation", args.eval_n, seed=args.seed, difficulty=TRAIN_DIFFICULTY)
QUICK_VAL = VAL[: min(64, len(VAL))]
DATA_SEED = args.seed if args.data_seed is None else args.data_seed


def save(model, name: str) -> None:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    model.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)


def labelled(problems: list[TestbedProblem], texts: list[str], what: str) -> list[tuple[TestbedProblem, list[str]]]:
    """(problem, steps) of each text that has steps; logs and reports how many steps are wrong."""
    samples = [(q, steps) for q, t in zip(problems, texts) if (steps := split_steps(t))]
    labels = [ok for q, steps in samples for ok in check_steps(q, steps)]
    wrong = float(1 - np.mean(labels)) if labels else float("nan")
    log(f"{what}: {len(samples)} solutions, {len(labels)} steps, {wrong:.3f} wrong")
    REPORT.setdefault("samples", {})[what] = {"solutions": len(samples), "steps": len(labels), "wrong_step_frac": wrong}
    return samples


def sample_model(model, n: int, max_new: int, seed: int, name: str) -> list[tuple[TestbedProblem, list[str]]]:
    """Sampled (temperature 1) and greedy solutions of n training problems (none if n is 0)."""
    if not n:
        return []
    probs = generate_problems("train", n, seed=10_000 + seed, difficulty=TRAIN_DIFFICULTY)
    half = n // 2
    texts = generate(model, probs[:half], max_new) + generate(model, probs[half:], max_new, temperature=1.0, seed=seed)
    return labelled(probs, texts, f"{name} samples")


def stretch_samples(model, n: int, max_new: int, seed: int, name: str) -> list[tuple[TestbedProblem, list[str]]]:
    """Greedy solutions of n training problems whose operands run a little past the training
    range: the model errs there often, and greedily, the way it errs on test problems."""
    if not n:
        return []
    probs = generate_problems("train", n, seed=30_000 + seed, difficulty=STRETCH_DIFFICULTY)
    return labelled(probs, generate(model, probs, max_new), f"{name} stretch")


def causal_lm(name: str, init: Path | None, layers: int, hidden: int) -> LlamaForCausalLM:
    """A fresh model of the given shape, or the checkpoint `init` to continue from."""
    if init is not None:
        model = LlamaForCausalLM.from_pretrained(init)
        log(f"{name}: continuing from {init}")
    else:
        model = LlamaForCausalLM(llama_config(layers, hidden))
    log(f"{name}: {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, {n_params(model) / 1e6:.3f}M params")
    return model


# ----------------------------------------------------------------------------- 2. SLM

if "slm" in PHASES:
    torch.manual_seed(args.seed + 1)
    slm = causal_lm("SLM", args.init_slm, args.slm_layers, args.slm_hidden)
    srng = random.Random(args.seed + 6)
    slm_stream = problem_stream(DATA_SEED, "slm")

    def slm_example():
        q = next(slm_stream)
        return stitched_example(q, "concise", srng) if srng.random() < args.stitch_frac else lm_example(q, "concise")

    batches = bucketed(slm_example, args.batch_size, random.Random(args.seed + 10))
    REPORT["slm_train"] = train_loop(
        slm, batches, args.steps_slm, args.minutes_slm, "slm", lm_loss,
        eval_fn=lambda m: log(f"  slm quick val acc {accuracy(m, QUICK_VAL, args.max_new_concise)['accuracy']:.3f}"),
    )
    REPORT["slm_train"]["params"] = n_params(slm)
    save(slm, "slm")
else:
    slm = LlamaForCausalLM.from_pretrained(OUT / "slm")
slm.eval()

# ----------------------------------------------------------------------------- 3. SLM samples

slm_samples = sample_model(slm, args.sample_slm, args.max_new_concise, seed=1, name="SLM")

# ----------------------------------------------------------------------------- 4. LLM (+ judge)

if "llm" in PHASES:
    torch.manual_seed(args.seed + 2)
    llm = causal_lm("LLM", args.init_llm, args.llm_layers, args.llm_hidden)
    jrng = random.Random(args.seed + 3)
    llm_stream = problem_stream(DATA_SEED, "llm")

    def llm_example():
        q = next(llm_stream)
        draw = jrng.random()
        if draw < args.judge_frac:
            return judge_example(q, jrng, slm_samples)
        if draw < args.judge_frac + args.stitch_frac:
            return stitched_example(q, "verbose", jrng)
        return lm_example(q, "verbose")

    batches = bucketed(llm_example, args.batch_size, random.Random(args.seed + 11))
    REPORT["llm_train"] = train_loop(
        llm, batches, args.steps_llm, args.minutes_llm, "llm", lm_loss,
        eval_fn=lambda m: log(f"  llm quick val acc {accuracy(m, QUICK_VAL, args.max_new_verbose)['accuracy']:.3f}"),
    )
    REPORT["llm_train"]["params"] = n_params(llm)
    save(llm, "llm")
else:
    llm = LlamaForCausalLM.from_pretrained(OUT / "llm")
llm.eval()

# ----------------------------------------------------------------------------- 5. LLM samples

llm_samples = sample_model(llm, args.sample_llm, args.max_new_verbose, seed=2, name="LLM")
llm_stretch = stretch_samples(llm, args.stretch_llm, args.max_new_verbose, seed=4, name="LLM") if "prm" in PHASES else []

# ----------------------------------------------------------------------------- 6. PRM


@torch.no_grad()
def prm_features(model, head: LikelihoodHead, items: list[tuple[TestbedProblem, list[str]]], bs: int = 32):
    """Features and checker labels of every step of `items`, read as `TestbedPRM` reads them
    (same input ids, same features), with batched forwards of the PRM's language model."""
    values = CheckedValues(head, tok)
    rows_of = CheckedLogProbs(model.lm_head, values)
    feats, labels = [], []
    for i in range(0, len(items), bs):
        chunk = items[i : i + bs]
        enc = [encode_prm_input(tok, q.problem, steps) for q, steps in chunk]
        ids, _, att = collate([(x, x) for x, *_ in enc])
        rows = rows_of(model.model(input_ids=ids, attention_mask=att).last_hidden_state)
        for b, ((q, steps), (x, start, ends)) in enumerate(zip(chunk, enc)):
            feats.append(step_features(rows[b, : len(x)], x, start, ends, values, head.floor))
            labels += check_steps(q, steps)
    return torch.cat(feats), torch.tensor(labels, dtype=torch.float32)


if "prm" in PHASES:
    prng = random.Random(args.seed + 5)
    prm_stream = problem_stream(DATA_SEED, "prm")
    pools = [slm_samples, llm_samples, llm_stretch]
    items = [labelled_sample(next(prm_stream), prng, pools)[:2] for _ in range(args.prm_solutions)]
    t0 = time.time()
    prm_head = LikelihoodHead()
    x, y = prm_features(llm, prm_head, items)
    fit = fit_head(x, y, prm_head)
    scores = prm_head.score(x)
    REPORT["prm_train"] = {"solutions": len(items), "steps": len(y), "wrong_step_frac": float(1 - y.mean()),
                           "auc": roc_auc(scores.tolist(), y.bool().tolist()), **fit,
                           "weight": prm_head.weight, "bias": prm_head.bias, "minutes": round((time.time() - t0) / 60, 2)}
    log(f"PRM head on {len(y)} steps: weight {prm_head.weight}, bias {prm_head.bias}, train AUC {REPORT['prm_train']['auc']:.3f}")
    if (OUT / "prm").exists():
        shutil.rmtree(OUT / "prm")
    (OUT / "prm").mkdir(parents=True)
    prm_head.save(OUT / "prm")  # the head only: it reads the LLM's weights (conf/prm/testbed.yaml `model`)
else:
    prm_head = LikelihoodHead.load(OUT / "prm")

# ----------------------------------------------------------------------------- 7. validation report

log("evaluating on validation")
slm_eval = accuracy(slm, VAL, args.max_new_concise)
llm_eval = accuracy(llm, VAL, args.max_new_verbose)
log(f"SLM val acc {slm_eval['accuracy']:.3f}, mean tokens {slm_eval['mean_output_tokens']:.1f} ({slm_eval['seconds']}s)")
log(f"LLM val acc {llm_eval['accuracy']:.3f}, mean tokens {llm_eval['mean_output_tokens']:.1f} ({llm_eval['seconds']}s)")
REPORT["val"] = {
    "slm": {k: v for k, v in slm_eval.items() if k != "texts"},
    "llm": {k: v for k, v in llm_eval.items() if k != "texts"},
    "token_ratio_slm_over_llm": slm_eval["mean_output_tokens"] / max(1e-9, llm_eval["mean_output_tokens"]),
}
for name, ev in (("slm", slm_eval), ("llm", llm_eval)):
    items = [(q, split_steps(t)) for q, t in zip(VAL, ev["texts"]) if split_steps(t)]
    x, lab = prm_features(llm, prm_head, items) if items else (torch.zeros(0, 2), torch.zeros(0))
    REPORT["val"][f"prm_auc_{name}_steps"] = roc_auc(prm_head.score(x).tolist(), lab.bool().tolist())
    REPORT["val"][f"{name}_wrong_step_frac"] = float(1 - lab.mean()) if len(lab) else float("nan")

# judge: P(digit 9) vs P(digit 0) on SLM-generated validation steps
vrng = random.Random(args.seed + 6)
j_scores, j_labels = [], []
with torch.no_grad():
    for q, t in zip(VAL[:100], slm_eval["texts"][:100]):
        steps = split_steps(t)
        if not steps:
            continue
        labels = check_steps(q, steps)
        k = vrng.randrange(len(steps))
        ids = tok.encode(judge_prompt(tok, q.problem, steps[: k + 1], STEP_SEPARATOR), add_special_tokens=False)
        lp = llm(input_ids=torch.tensor([ids])).logits[0, -1, DIGIT_IDS].log_softmax(-1)
        j_scores.append(float((lp.exp() * torch.arange(10)).sum()))
        j_labels.append(labels[k])
REPORT["val"]["judge_auc_slm_steps"] = roc_auc(j_scores, j_labels)
REPORT["total_minutes"] = round((time.time() - T0) / 60, 2)
log(json.dumps(REPORT["val"], indent=1))
(OUT / "train_report.json").write_text(json.dumps(REPORT, indent=1))
log(f"done in {REPORT['total_minutes']} min -> {OUT}")
if OUT.resolve() == ASSETS_DIR.resolve():
    # Everything downstream was fitted to the family it replaced; stale routers fail silently.
    log("the package's R-Stitch+ router, Arbitrage router, EASD tau_H and latency model belong to the previous family: "
        "rerun scripts/train_router.py, scripts/train_arbitrage_router.py and scripts/calibrate_easd.py "
        "(docs/testbed.md, 'Training')")
