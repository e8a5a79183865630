"""The testbed's model family trained from scratch: `FamilyTrainer(args).run()`, called by
scripts/train_testbed.py (docs/testbed.md, "Training")."""
from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from rstitch.engines.hf import cache_kwargs
from rstitch.judge_prompt import judge_prompt
from rstitch.methods.specreason import digit_ids, digit_score
from rstitch.results.uncertainty import roc_auc
from rstitch.scorers.likelihood_prm import CheckedLogProbs, CheckedValues, LikelihoodHead, encode_prm_input, fit_head, step_features
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

TRAIN_DIFFICULTY = Difficulty()  # the default "medium" mix: 1-6 ops, start and operands <= 50
STRETCH_DIFFICULTY = Difficulty(max_start=70, max_operand=70)


PHASE_STREAM = {"slm": 0, "llm": 1, "prm": 2}
T0 = time.time()  # log lines say seconds since the job started (this module's import)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def problem_stream(seed: int, phase: str):
    """Endless deterministic stream of training problems, one per phase: a phase sees the same
    problems whether the phases before it ran in this process or were loaded (`--only`)."""
    chunk, base = 0, PHASE_STREAM[phase] * 1_000_000 + seed * 1000
    while True:
        yield from generate_problems("train", 4096, seed=base + chunk, difficulty=TRAIN_DIFFICULTY)
        chunk += 1


def mixed_steps(prob: TestbedProblem, rng: random.Random, corrupt: bool) -> list[str]:
    """Steps in concise, verbose or mixed style (each step from either), optionally with one injected error."""
    style = rng.choice(["concise", "verbose", "mixed"])
    if corrupt:
        state = rng.random()
        c = corrupt_steps(prob, "concise", random.Random(state))
        v = corrupt_steps(prob, "verbose", random.Random(state))
    else:
        c, v = prob.steps("concise"), prob.steps("verbose")
    if style != "mixed":
        return c if style == "concise" else v
    # c = [op1..opn, box]; v = [start, op1..opn, final]: the opening or not, then each step from either
    opening = [v[0]] if rng.random() < 0.5 else []
    return opening + [c[i] if rng.random() < 0.5 else v[i + 1] for i in range(len(c))]


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


def padded(rows: list[list[int]], pad: int, side: str = "right", device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one tensor padded with ``pad`` on ``side``, and its attention mask, on ``device``."""
    ids = pad_sequence([torch.tensor(row, dtype=torch.long) for row in rows], batch_first=True, padding_value=pad, padding_side=side)
    mask = pad_sequence([torch.ones(len(row), dtype=torch.long) for row in rows], batch_first=True, padding_side=side)
    return ids.to(device), mask.to(device)


@torch.no_grad()
def decode_rows(model: Any, rows: list[list[int]], pad: int, ended: Callable[[int, list[int]], bool], temperature: float = 0.0,
                generator: torch.Generator | None = None, vocab_size: int | None = None, device: Any = "cpu") -> list[list[int]]:
    """The continuation of every row, decoded together (left padding, one KV cache), greedy or
    sampled at `temperature`; row i stops once `ended(i, its tokens)`."""
    ids, mask = padded(rows, pad, side="left", device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = cache_kwargs(model, DynamicCache(config=model.config))  # filled in place by each forward
    outputs: list[list[int]] = [[] for _ in rows]
    done = [ended(i, []) for i in range(len(rows))]
    while not all(done):
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache)
        logits = out.logits[:, -1, :vocab_size].float().cpu()
        if temperature > 0:
            tokens = torch.multinomial(F.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        else:
            tokens = logits.argmax(-1)
        for i, token in enumerate(tokens.tolist()):
            if not done[i]:
                outputs[i].append(token)
                done[i] = ended(i, outputs[i])
        ids, positions = tokens[:, None].to(device), positions[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], 1)
    return outputs


def collate(pad: int, batch: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, labels (as long as the ids, -100 off the loss) and attention mask."""
    ids, att = padded([x for x, _ in batch], pad)
    return ids, padded([y for _, y in batch], -100)[0], att


def bucketed(make_example, batch_size: int, rng: random.Random, pool: int = 8):
    """Batches of similar length: draw pool*batch_size examples, sort by length, shuffle the batches."""
    while True:
        exs = sorted((make_example() for _ in range(pool * batch_size)), key=lambda e: len(e[0]))
        batches = [exs[i : i + batch_size] for i in range(0, len(exs), batch_size)]
        rng.shuffle(batches)
        yield from batches


def lr_at(step: int, total: int, base: float, time_frac: float = 0.0, warmup: int = 100) -> float:
    """Linear warmup, then cosine decay to 10% over the run. The run's progress is the step
    fraction, or with --schedule-by-time the larger of it and the fraction of the time cap used
    (a phase that hits its time cap then still ends decayed, but depends on the machine's speed)."""
    warmup = min(warmup, max(1, total // 10))
    if step < warmup:
        return base * (step + 1) / warmup
    frac = max((step - warmup) / max(1, total - warmup), time_frac)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class FamilyTrainer:
    """One training run of the testbed family (scripts/train_testbed.py's arguments); builds or loads the tokenizer at once."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.phases = set(args.only.split(","))
        self.report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
        if args.tokenizer is not None:  # continuing from checkpoints: keep their token ids
            self.tok = load_tokenizer(args.tokenizer)
            self.tok.save_pretrained(str(self.out / "tokenizer"))
        else:
            self.tok = build_tokenizer(self.out / "tokenizer")
        self.eos, self.pad = self.tok.eos_token_id, self.tok.pad_token_id
        self.digit_ids = digit_ids(self.tok)  # the judge's answers "0".."9", each a single token (checked)
        log(f"tokenizer: vocab {len(self.tok)}")
        self.val = generate_problems("validation", args.eval_n, seed=args.seed, difficulty=TRAIN_DIFFICULTY)
        self.data_seed = args.seed if args.data_seed is None else args.data_seed

    def lm_example(self, prob: TestbedProblem, text: str, cut: int = 0) -> tuple[list[int], list[int]]:
        """prompt + text + eos; loss on the text from its token `cut` on, and on eos."""
        prompt = self.tok.encode(render_prompt(self.tok, prob.problem), add_special_tokens=False)
        body = self.tok.encode(text, add_special_tokens=False) + [self.eos]
        return prompt + body, [-100] * (len(prompt) + cut) + body[cut:]

    def stitched_example(self, prob: TestbedProblem, style: str, rng: random.Random) -> tuple[list[int], list[int]]:
        """A solution begun by the other model, cut at any token, continued by a model of `style` (loss
        on the continuation only). R-Stitch hands single tokens between the models mid-step, so each
        must continue the other's text wherever it stops. The LLM ("verbose") continues concise text
        concisely, so a stitched solution keeps one style; the SLM ("concise") finishes a verbose step
        as written, then goes on concisely."""
        if style == "verbose":
            text = prob.solution("concise")
            cut_lo, cut_hi = 1, len(text)
        else:
            verbose = prob.steps("verbose")
            i = rng.randrange(len(verbose))  # step the cut falls in: 0 opening, 1..n operations, n+1 closing
            concise_rest = prob.steps("concise")[i:] if i <= len(prob.ops) else []
            head = STEP_SEPARATOR.join(verbose[: i + 1])
            cut_lo = len(STEP_SEPARATOR.join(verbose[:i])) + (len(STEP_SEPARATOR) if i else 0)
            cut_hi = len(head)
            text = STEP_SEPARATOR.join([head, *concise_rest])
        starts = [a for a, _ in self.tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
        cuts = [j for j, a in enumerate(starts) if j >= 1 and cut_lo <= a < cut_hi] or [len(starts)]
        return self.lm_example(prob, text, rng.choice(cuts))

    def judge_example(self, prob: TestbedProblem, rng: random.Random, sampled: list) -> tuple[list[int], list[int]]:
        """SpecReason judge: [problem, steps so far, instruction] + prefix -> one digit."""
        prob, steps, labels = labelled_sample(prob, rng, [sampled])
        if not steps:
            steps, labels = prob.steps("concise"), [True] * (len(prob.ops) + 1)
        wrong = [i for i, ok in enumerate(labels) if not ok]
        # half of the time rate the first wrong step (the informative case), else a random step
        t = wrong[0] if wrong and rng.random() < 0.5 else rng.randrange(len(steps))
        prompt = self.tok.encode(judge_prompt(self.tok, prob.problem, steps[: t + 1], STEP_SEPARATOR), add_special_tokens=False)
        digit = self.digit_ids[9] if labels[t] else self.digit_ids[0]
        return prompt + [digit], [-100] * len(prompt) + [digit]

    def train_loop(self, model, batches, steps: int, minutes: float, name: str, max_new: int) -> dict:
        """AdamW on the next-token loss of `batches` for `steps` steps, or until `minutes` pass; every
        `--eval-every` steps the accuracy on 64 validation problems (`max_new` tokens) is logged."""
        lr = self.args.lr
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
        model.train()
        t0, ema, step = time.time(), None, 0
        for step in range(steps):
            time_frac = (time.time() - t0) / (minutes * 60)
            if time_frac > 1:
                log(f"{name}: time cap reached at step {step}")
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, lr, time_frac if self.args.schedule_by_time else 0.0)
            ids, lab, att = collate(self.pad, next(batches))
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), lab[:, 1:].reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
            if step % 100 == 0 or step == steps - 1:
                log(f"{name} step {step}/{steps} loss {ema:.4f} lr {opt.param_groups[0]['lr']:.2e}")
            if self.args.eval_every and step and step % self.args.eval_every == 0:
                model.eval()
                log(f"  {name} quick val acc {self.accuracy(model, self.val[:64], max_new)['accuracy']:.3f}")
                model.train()
        model.eval()
        return {"steps": step + 1, "minutes": round((time.time() - t0) / 60, 2)}

    def generate(self, model, problems: list[TestbedProblem], max_new: int, temperature: float = 0.0, seed: int = 0, bs: int = 64):
        """Greedy (or sampled) completions, `bs` problems decoded together."""
        generator, outs = torch.Generator().manual_seed(seed), []
        ended = lambda _, tokens: len(tokens) >= max_new or bool(tokens) and tokens[-1] == self.eos  # noqa: E731
        for i in range(0, len(problems), bs):
            rows = [self.tok.encode(render_prompt(self.tok, q.problem), add_special_tokens=False) for q in problems[i : i + bs]]
            outs += [self.tok.decode([t for t in row if t not in (self.pad, self.eos)])
                     for row in decode_rows(model, rows, self.pad, ended, temperature, generator)]
        return outs

    def accuracy(self, model, problems, max_new: int) -> dict:
        t0 = time.time()
        texts = self.generate(model, problems, max_new)
        acc = float(np.mean([extract_boxed(t) == q.answer for t, q in zip(texts, problems)]))
        ntok = float(np.mean([len(self.tok.encode(t, add_special_tokens=False)) + 1 for t in texts]))
        return {"accuracy": acc, "mean_output_tokens": ntok, "n": len(problems), "seconds": round(time.time() - t0, 1), "texts": texts}

    def sample_model(self, model, n: int, max_new: int, seed: int, what: str, stretch: bool = False) -> list[tuple[TestbedProblem, list[str]]]:
        """(problem, steps) of n training problems' solutions, half greedy and half sampled at temperature 1;
        with `stretch`, all greedy on operands a little past the training range, where the model errs
        often, and greedily, the way it errs on test problems. Reports how many steps are wrong."""
        if not n:
            return []
        base, difficulty = (30_000, STRETCH_DIFFICULTY) if stretch else (10_000, TRAIN_DIFFICULTY)
        probs = generate_problems("train", n, seed=base + seed, difficulty=difficulty)
        greedy = n if stretch else n // 2
        texts = self.generate(model, probs[:greedy], max_new) + self.generate(model, probs[greedy:], max_new, temperature=1.0, seed=seed)
        samples = [(q, steps) for q, t in zip(probs, texts) if (steps := split_steps(t))]
        labels = [ok for q, steps in samples for ok in check_steps(q, steps)]
        wrong = float(1 - np.mean(labels)) if labels else float("nan")
        log(f"{what}: {len(samples)} solutions, {len(labels)} steps, {wrong:.3f} wrong")
        self.report.setdefault("samples", {})[what] = {"solutions": len(samples), "steps": len(labels), "wrong_step_frac": wrong}
        return samples

    @torch.no_grad()
    def prm_features(self, model, head: LikelihoodHead, items: list[tuple[TestbedProblem, list[str]]], bs: int = 32):
        """Features and checker labels of every step of `items`, read as `TestbedPRM` reads them
        (same input ids, same features), with batched forwards of the PRM's language model."""
        values = CheckedValues(head, self.tok)
        rows_of = CheckedLogProbs(model.lm_head, values)
        feats, labels = [], []
        for i in range(0, len(items), bs):
            chunk = items[i : i + bs]
            enc = [encode_prm_input(self.tok, q.problem, steps) for q, steps in chunk]
            ids, att = padded([x for x, *_ in enc], self.pad)
            rows = rows_of(model.model(input_ids=ids, attention_mask=att).last_hidden_state)
            for b, ((q, steps), (x, start, ends)) in enumerate(zip(chunk, enc)):
                feats.append(step_features(rows[b, : len(x)], x, start, ends, values, head.floor))
                labels += check_steps(q, steps)
        return torch.cat(feats), torch.tensor(labels, dtype=torch.float32)

    def train_lm(self, name: str, style: str, example: Callable[[TestbedProblem], tuple], seeds: tuple[int, int]) -> LlamaForCausalLM:
        """Model `name` (its sizes and budgets are the options named after it; `init_<name>`: a
        checkpoint to continue from) trained on `example`s of its phase's problem stream; loaded when
        its phase is skipped."""
        args, init, hidden = self.args, getattr(self.args, f"init_{name}"), getattr(self.args, f"{name}_hidden")
        if name not in self.phases:
            return LlamaForCausalLM.from_pretrained(self.out / name).eval()
        torch.manual_seed(args.seed + seeds[0])
        if init is not None:
            model = LlamaForCausalLM.from_pretrained(init)
            log(f"{name.upper()}: continuing from {init}")
        else:
            model = LlamaForCausalLM(LlamaConfig(  # type: ignore[call-arg]
                vocab_size=len(self.tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=getattr(args, f"{name}_layers"),
                num_attention_heads=4, num_key_value_heads=4,
                head_dim=32,  # vLLM's CPU attention takes head sizes 32, 64, 80, ... (not hidden / 4)
                max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                bos_token_id=self.tok.bos_token_id, eos_token_id=self.eos, pad_token_id=self.pad,
            ))
        log(f"{name.upper()}: {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
                 f"{model.num_parameters() / 1e6:.3f}M params")
        stream = problem_stream(self.data_seed, name)
        batches = bucketed(lambda: example(next(stream)), args.batch_size, random.Random(args.seed + seeds[1]))
        self.report[f"{name}_train"] = self.train_loop(model, batches, getattr(args, f"steps_{name}"), getattr(args, f"minutes_{name}"),
                                                       name, getattr(args, f"max_new_{style}"))
        self.report[f"{name}_train"]["params"] = model.num_parameters()
        shutil.rmtree(self.out / name, ignore_errors=True)
        model.save_pretrained(self.out / name, safe_serialization=True)
        self.tok.save_pretrained(self.out / name)
        return model.eval()

    def train_slm(self) -> LlamaForCausalLM:
        """The SLM: concise solutions (and continuations of the LLM's text)."""
        rng = random.Random(self.args.seed + 6)

        def example(q: TestbedProblem) -> tuple[list[int], list[int]]:
            return self.stitched_example(q, "concise", rng) if rng.random() < self.args.stitch_frac else self.lm_example(q, q.solution("concise"))

        return self.train_lm("slm", "concise", example, seeds=(1, 10))

    def train_llm(self, slm_samples: list) -> LlamaForCausalLM:
        """The LLM: verbose solutions, continuations of the SLM's text, and SpecReason's judge on
        the SLM's sampled steps."""
        rng, judge_frac = random.Random(self.args.seed + 3), self.args.judge_frac

        def example(q: TestbedProblem) -> tuple[list[int], list[int]]:
            draw = rng.random()
            if draw < judge_frac:
                return self.judge_example(q, rng, slm_samples)
            if draw < judge_frac + self.args.stitch_frac:
                return self.stitched_example(q, "verbose", rng)
            return self.lm_example(q, q.solution("verbose"))

        return self.train_lm("llm", "verbose", example, seeds=(2, 11))

    def fit_prm(self, llm: LlamaForCausalLM, pools: list[list]) -> LikelihoodHead:
        """The PRM's head on the LLM's features of labelled steps (templates and the models' own
        samples from `pools`); loaded when its phase is skipped."""
        if "prm" not in self.phases:
            return LikelihoodHead.load(self.out / "prm")
        prng = random.Random(self.args.seed + 5)
        prm_stream = problem_stream(self.data_seed, "prm")
        items = [labelled_sample(next(prm_stream), prng, pools)[:2] for _ in range(self.args.prm_solutions)]
        t0 = time.time()
        prm_head = LikelihoodHead()
        x, y = self.prm_features(llm, prm_head, items)
        fit = fit_head(x, y, prm_head)
        self.report["prm_train"] = {"solutions": len(items), "steps": len(y), "wrong_step_frac": float(1 - y.mean()),
                                    "auc": roc_auc(prm_head.score(x).tolist(), y.bool().tolist()), **fit,
                                    "weight": prm_head.weight, "bias": prm_head.bias, "minutes": round((time.time() - t0) / 60, 2)}
        log(f"PRM head on {len(y)} steps: weight {prm_head.weight}, bias {prm_head.bias}, "
                 f"train AUC {self.report['prm_train']['auc']:.3f}")
        shutil.rmtree(self.out / "prm", ignore_errors=True)
        (self.out / "prm").mkdir(parents=True)
        prm_head.save(self.out / "prm")  # the head only: it reads the LLM's weights (conf/prm/testbed.yaml `model`)
        return prm_head

    def validate(self, slm: LlamaForCausalLM, llm: LlamaForCausalLM, prm_head: LikelihoodHead) -> None:
        """Accuracy and output length of both models, the PRM's ROC-AUC on each one's steps, and
        the judge's on the SLM's, on the validation split: report["val"]."""
        log("evaluating on validation")
        evals = {"slm": self.accuracy(slm, self.val, self.args.max_new_concise), "llm": self.accuracy(llm, self.val, self.args.max_new_verbose)}
        for name, ev in evals.items():
            log(f"{name.upper()} val acc {ev['accuracy']:.3f}, mean tokens {ev['mean_output_tokens']:.1f} ({ev['seconds']}s)")
        self.report["val"] = {name: {k: v for k, v in ev.items() if k != "texts"} for name, ev in evals.items()}
        self.report["val"]["token_ratio_slm_over_llm"] = evals["slm"]["mean_output_tokens"] / max(1e-9, evals["llm"]["mean_output_tokens"])
        for name, ev in evals.items():
            items = [(q, split_steps(t)) for q, t in zip(self.val, ev["texts"]) if split_steps(t)]
            x, lab = self.prm_features(llm, prm_head, items) if items else (torch.zeros(0, 2), torch.zeros(0))
            self.report["val"][f"prm_auc_{name}_steps"] = roc_auc(prm_head.score(x).tolist(), lab.bool().tolist())
            self.report["val"][f"{name}_wrong_step_frac"] = float(1 - lab.mean()) if len(lab) else float("nan")
        self.report["val"]["judge_auc_slm_steps"] = self.judge_auc(llm, evals["slm"]["texts"])

    @torch.no_grad()
    def judge_auc(self, llm: LlamaForCausalLM, slm_texts: list[str]) -> float:
        """The judge's expected digit (from P over "0".."9") against the checker's label, on one
        random step of each of the first 100 SLM validation solutions."""
        vrng = random.Random(self.args.seed + 6)
        j_scores, j_labels = [], []
        for q, t in zip(self.val[:100], slm_texts[:100]):
            steps = split_steps(t)
            if not steps:
                continue
            k = vrng.randrange(len(steps))
            ids = self.tok.encode(judge_prompt(self.tok, q.problem, steps[: k + 1], STEP_SEPARATOR), add_special_tokens=False)
            j_scores.append(digit_score(llm(input_ids=torch.tensor([ids])).logits[0, -1], self.digit_ids, "expected"))
            j_labels.append(check_steps(q, steps)[k])
        return roc_auc(j_scores, j_labels)

    def run(self) -> dict:
        """Every phase in order (skipped ones load their checkpoints), then train_report.json."""
        args = self.args
        slm = self.train_slm()
        slm_samples = self.sample_model(slm, args.sample_slm, args.max_new_concise, seed=1, what="SLM samples")
        llm = self.train_llm(slm_samples)
        llm_samples = self.sample_model(llm, args.sample_llm, args.max_new_verbose, seed=2, what="LLM samples")
        stretch_n = args.stretch_llm if "prm" in self.phases else 0
        llm_stretch = self.sample_model(llm, stretch_n, args.max_new_verbose, seed=4, what="LLM stretch", stretch=True)
        prm_head = self.fit_prm(llm, [slm_samples, llm_samples, llm_stretch])
        self.validate(slm, llm, prm_head)
        self.report["total_minutes"] = round((time.time() - T0) / 60, 2)
        log(json.dumps(self.report["val"], indent=1))
        (self.out / "train_report.json").write_text(json.dumps(self.report, indent=1))
        log(f"done in {self.report['total_minutes']} min -> {self.out}")
        if self.out.resolve() == ASSETS_DIR.resolve():
            # Everything downstream was fitted to the family it replaced; stale routers fail silently.
            log("the package's R-Stitch+ router, Arbitrage router, EASD tau_H and latency model belong to the previous family: "
                     "rerun scripts/train_router.py, scripts/train_arbitrage_router.py and scripts/calibrate_easd.py "
                     "(docs/testbed.md, 'Training')")
        return self.report
