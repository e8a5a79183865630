"""The HF engine's static decode path (engine.compile=static, uncaptured) against transformers'
own StaticCache on the same model, on CPU: prefill of one prompt and greedy per-token decode,
alternating rounds, medians. Prints each time and the ratio ours / transformers' (goal: <= 1.1).

    python scripts/bench_static.py                      # the testbed LLM
    python scripts/bench_static.py --model PATH --prompt-tokens 200 --new-tokens 64
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from transformers import PreTrainedModel

from rstitch.engines import Sampler
from rstitch.engines.hf import HFModelRunner
from rstitch.errors import ConfigError
from rstitch.testbed import LLM_DIR


def ours(runner: HFModelRunner, prompt: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
    """Seconds of the prefill, seconds per decoded token, and the tokens."""
    seq = runner.new_sequence(prompt)
    start = time.perf_counter()
    first = seq.generate(1, Sampler()).token_ids
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    rest = seq.generate(new_tokens, Sampler()).token_ids
    return prefill, (time.perf_counter() - start) / new_tokens, first + rest


@torch.inference_mode()
def transformers_static(model: PreTrainedModel, prompt: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
    """The same with transformers' StaticCache (sized to the prompt and the new tokens) and a
    plain greedy loop over the model's forward."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=len(prompt) + new_tokens + 1)
    start = time.perf_counter()
    out = model(input_ids=torch.tensor([prompt]), cache=cache, logits_to_keep=1)
    tokens = [int(out.logits[0, -1].argmax())]
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(new_tokens):
        out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, logits_to_keep=1)
        tokens.append(int(out.logits[0, -1].argmax()))
    return prefill, (time.perf_counter() - start) / new_tokens, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(LLM_DIR), help="a causal LM directory (default: the testbed LLM)")
    parser.add_argument("--prompt-tokens", type=int, default=120)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        runner = HFModelRunner(args.model, compile="static", num_threads=args.threads)
    except ConfigError as err:
        print(f"bench_static: {err}", file=sys.stderr)
        return 2
    vocab = runner.vocab_size
    prompt = [3 + (i * 7) % (vocab - 3) for i in range(args.prompt_tokens)]
    ours(runner, prompt, 4), transformers_static(runner.model, prompt, 4)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "transformers": []}
    for _ in range(args.rounds):
        a = ours(runner, prompt, args.new_tokens)
        b = transformers_static(runner.model, prompt, args.new_tokens)
        if a[2][: len(b[2])] != b[2][: len(a[2])]:
            print("bench_static: the two paths decoded different tokens", file=sys.stderr)
            return 1
        times["ours"].append(a[:2])
        times["transformers"].append(b[:2])
    print(f"{runner.name}: {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), median of {args.rounds} alternating rounds")
    print(f"{'':14}{'ours':>12}{'transformers':>14}{'ratio':>8}")
    for i, label in enumerate(("prefill ms", "decode ms/tok")):
        mine = statistics.median(t[i] for t in times["ours"]) * 1e3
        theirs = statistics.median(t[i] for t in times["transformers"]) * 1e3
        print(f"{label:14}{mine:12.2f}{theirs:14.2f}{mine / theirs:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
