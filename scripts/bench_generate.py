"""The reference for batching gains: HF `generate` itself, at batch 1 and batch N, on the pair's
models (docs/batching.md). `scripts/bench_batch.py` measures what our scheduler gains at batch N;
this measures what plain `generate` gains on the same machine, prompts and threads, so the two
gains can be compared within one sitting (absolute speeds drift between days).

    python scripts/bench_generate.py --pair qwen2.5_coder_0.5b_1.5b --problems 8 --tokens 128 --batch-sizes 1 8

Greedy, a fixed number of new tokens per row (end tokens ignored, so every row decodes exactly
--tokens and tokens/s counts the same work at every batch size), left-padded prompts of the
pair's prompt format over the first GSM8K problems; the time of one warm-up call is excluded.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rstitch.cli.run import compose_config
from rstitch.data.prompts import PromptFormat
from rstitch.engines import packaged
from rstitch.engines.hf import load_causal_lm
from rstitch.errors import exit_on_config_error

BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


def prompts(prompt: PromptFormat, tokenizer, n: int) -> list[list[int]]:
    with open(BENCHMARKS / "gsm8k.jsonl") as f:
        records = [json.loads(line) for line, _ in zip(f, range(n))]
    return [prompt.encode(tokenizer, r["problem"] if "problem" in r else r["question"]) for r in records]


def generate_tokens_per_s(model, rows: list[list[int]], batch_size: int, n_tokens: int, pad_id: int) -> float:
    """New tokens per second over all rows, `batch_size` rows per `generate` call."""
    start, produced = time.perf_counter(), 0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in chunk])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in chunk])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                                 do_sample=False, pad_token_id=pad_id)
        produced += (out.shape[1] - width) * len(chunk)
    return produced / (time.perf_counter() - start)


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="qwen2.5_coder_0.5b_1.5b")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = compose_config([f"pair={args.pair}", "logger=none"])
    from transformers import AutoTokenizer

    print(f"| model | batch | tokens/s | gain over batch {args.batch_sizes[0]} |\n|---|---:|---:|---:|")
    for role in ("slm", "llm"):
        spec = cfg["pair"][role]
        path = packaged.resolve(spec["path"]) if packaged.is_packaged(spec["path"]) else spec["path"]
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = load_causal_lm(path, cfg["pair"].get("dtype", "float32"), cfg["pair"].get("device", "cpu"))
        rows = prompts(PromptFormat(**cfg["prompt"]), tokenizer, args.problems)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        generate_tokens_per_s(model, rows[:1], 1, 4, pad_id)  # warm-up
        base = None
        for size in args.batch_sizes:
            rate = generate_tokens_per_s(model, rows, size, args.tokens, pad_id)
            base = base or rate
            print(f"| {spec['name']} | {size} | {rate:.2f} | {rate / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
