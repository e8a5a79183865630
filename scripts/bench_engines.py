"""Decode speed of the real pair on each engine at batch 1, and greedy agreement between engines.

    python scripts/bench_engines.py                          # hf and llamacpp, 128 tokens, 2 threads
    python scripts/bench_engines.py --engines llamacpp --tokens 256 --threads 2
    python scripts/bench_engines.py --agreement 10           # also: greedy outputs of 10 GSM8K problems per engine

Prints tokens/s of each model (greedy decoding of one GSM8K prompt, after a warm-up decode; every
forward a single token, as batch-1 decoding is), the LLM/SLM per-token latency ratio on each
engine, and with --agreement the share of problems whose greedy outputs are identical between
engines, with the first diverging position. Time it on a quiet machine: llama.cpp's threads
collapse when other processes share the cores.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rstitch.cli.run import compose_config
from rstitch.data.prompts import PromptFormat
from rstitch.engines import Sampler
from rstitch.engines.cache import clear_pairs, get_pair
from rstitch.errors import exit_on_config_error
from rstitch.methods import DecodeContext, build_method

BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


def problems(n: int) -> list[str]:
    with open(BENCHMARKS / "gsm8k.jsonl") as f:
        return [json.loads(line)["question"] for _, line in zip(range(n), f)]


def tokens_per_s(model, prompt_ids: list[int], n_tokens: int) -> float:
    model.new_sequence(prompt_ids).generate(8, Sampler(temperature=0.0), eos_ids=[])  # warm-up
    seq = model.new_sequence(prompt_ids)
    seq.next_distribution()  # the prompt's prefill is not decoding
    start = time.perf_counter()
    seq.generate(n_tokens, Sampler(temperature=0.0), eos_ids=[])
    return n_tokens / (time.perf_counter() - start)


def greedy_outputs(pair, prompt, texts: list[str], budget: int) -> list[list[int]]:
    method = build_method("llm_only")
    return [method.decode(prompt.encode(pair.tokenizer, t), DecodeContext(pair, Sampler(temperature=0.0), budget, t)).token_ids
            for t in texts]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="hf,llamacpp")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--agreement", type=int, default=0, help="greedy outputs of the first n GSM8K problems (LLM)")
    parser.add_argument("--budget", type=int, default=128, help="budget of the agreement decodes")
    args = parser.parse_args()
    outputs = {}
    rows = []
    for engine in args.engines.split(","):
        cfg = compose_config(["pair=qwen2.5_coder_0.5b_1.5b", f"engine={engine}", f"engine.num_threads={args.threads}"])
        pair = get_pair(cfg["pair"], cfg["engine"])
        prompt = PromptFormat(**cfg["prompt"])
        prompt_ids = prompt.encode(pair.tokenizer, problems(1)[0])
        speed = {role: tokens_per_s(model, prompt_ids, args.tokens) for role, model in pair.models().items()}
        rows.append((engine, speed["slm"], speed["llm"], speed["slm"] / speed["llm"]))
        print(f"{engine}: SLM {speed['slm']:.2f} tokens/s, LLM {speed['llm']:.2f} tokens/s, "
              f"LLM/SLM per-token latency {speed['slm'] / speed['llm']:.2f}", flush=True)
        if args.agreement:
            outputs[engine] = greedy_outputs(pair, prompt, problems(args.agreement), args.budget)
        clear_pairs()  # one pair in memory at a time
    print("\n| engine | SLM tokens/s | LLM tokens/s | LLM/SLM per-token latency |\n|---|---|---|---|")
    for engine, slm, llm, ratio in rows:
        print(f"| {engine} | {slm:.2f} | {llm:.2f} | {ratio:.2f} |")
    if len(outputs) == 2:
        (a, out_a), (b, out_b) = outputs.items()
        diverge = [first_divergence(x, y) for x, y in zip(out_a, out_b)]
        same = sum(d is None for d in diverge)
        print(f"\ngreedy LLM outputs, {a} vs {b}: {same}/{len(diverge)} identical over {args.budget} tokens; "
              f"first divergence at tokens {[d for d in diverge if d is not None]}")


if __name__ == "__main__":
    main()
