"""The HF engine's static decode path (engine.compile=static, uncaptured) against transformers'
own StaticCache on the same model, on CPU: prefill of one prompt and greedy per-token decode,
alternating rounds. Prints medians of wall-clock and CPU time (the decoding thread's with one
thread, the process's with more: steadier on a shared machine) and the ratio ours / transformers'
(goal: <= 1.1), as a ratio of medians and as the median of each round's ratio (the two paths
timed back to back), with the load average before and after.

    python scripts/bench_static.py                      # the testbed LLM
    python scripts/bench_static.py --model PATH --prompt-tokens 200 --new-tokens 64
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from rstitch.engines import Sampler
from rstitch.engines.hf import HFModelRunner
from rstitch.errors import exit_on_config_error
from rstitch.testbed import LLM_DIR

Times = tuple[float, float]  # (wall, cpu) seconds
CPU_CLOCK: Callable[[], float] = time.thread_time  # main() takes process_time with more than one thread


def now() -> Times:
    return time.perf_counter(), CPU_CLOCK()


def since(start: Times, per: int = 1) -> Times:
    wall, cpu = now()
    return (wall - start[0]) / per, (cpu - start[1]) / per


def ours(runner: HFModelRunner, prompt: list[int], new_tokens: int) -> tuple[Times, Times, list[int]]:
    """Seconds of the prefill, seconds per decoded token (each wall and CPU), and the tokens."""
    seq = runner.new_sequence(prompt)
    start = now()
    first = seq.generate(1, Sampler()).token_ids
    prefill = since(start)
    start = now()
    rest = seq.generate(new_tokens, Sampler()).token_ids
    return prefill, since(start, new_tokens), first + rest


@torch.inference_mode()
def transformers_static(model: PreTrainedModel, prompt: list[int], new_tokens: int) -> tuple[Times, Times, list[int]]:
    """The same with transformers' StaticCache (sized to the prompt and the new tokens) and a
    plain greedy loop over the model's forward."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=len(prompt) + new_tokens + 1)
    start = now()
    out = model(input_ids=torch.tensor([prompt]), cache=cache, logits_to_keep=1)
    tokens = [int(out.logits[0, -1].argmax())]
    prefill = since(start)
    start = now()
    for _ in range(new_tokens):
        out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, logits_to_keep=1)
        tokens.append(int(out.logits[0, -1].argmax()))
    return prefill, since(start, new_tokens), tokens


@exit_on_config_error()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(LLM_DIR), help="a causal LM directory (default: the testbed LLM)")
    parser.add_argument("--prompt-tokens", type=int, default=120)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    runner = HFModelRunner(args.model, compile="static", num_threads=args.threads)
    global CPU_CLOCK
    CPU_CLOCK = time.thread_time if args.threads == 1 else time.process_time
    vocab = runner.vocab_size
    prompt = [3 + (i * 7) % (vocab - 3) for i in range(args.prompt_tokens)]
    ours(runner, prompt, 4), transformers_static(runner.model, prompt, 4)  # warm-up
    load = os.getloadavg()[0]
    times: dict[str, list[tuple[Times, Times]]] = {"ours": [], "transformers": []}
    for _ in range(args.rounds):
        a = ours(runner, prompt, args.new_tokens)
        b = transformers_static(runner.model, prompt, args.new_tokens)
        if a[2][: len(b[2])] != b[2][: len(a[2])]:
            print("bench_static: the two paths decoded different tokens", file=sys.stderr)
            return 1
        times["ours"].append(a[:2])
        times["transformers"].append(b[:2])
    print(f"{runner.name}: {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), median of {args.rounds} alternating rounds, "
          f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'':20}{'ours':>10}{'transformers':>14}{'ratio':>8}{'per round':>11}")
    for i, label in enumerate(("prefill", "decode")):
        for j, clock in enumerate(("wall", "cpu")):
            mine = [t[i][j] for t in times["ours"]]
            theirs = [t[i][j] for t in times["transformers"]]
            paired = statistics.median(a / b for a, b in zip(mine, theirs))
            ms, their_ms = statistics.median(mine) * 1e3, statistics.median(theirs) * 1e3
            unit = "ms" if label == "prefill" else "ms/tok"
            print(f"{f'{label} {unit} {clock}':20}{ms:10.2f}{their_ms:14.2f}{ms / their_ms:8.2f}{paired:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
