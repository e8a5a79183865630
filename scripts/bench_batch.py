"""Throughput against batch size (docs/batching.md): samples/s and tokens/s of each method on the
testbed at batch sizes 1..32, and R-Stitch's Table 6 view (rstitch's speedup over llm_only at each
batch size). Every configuration runs through `rstitch.runner.run` into a temporary results
directory, one after the other in this process; `decode_wall_s` is the decode loop's wall clock
(loading and warm-up excluded). Each batched run's outputs are checked against batch 1's, and its
estimated batch-1 latency (mean `latency_s`) against the latency batch 1 measured. On the vLLM
engine (`--override engine=vllm ...`) it also counts vLLM requests and `generate` calls per
generated token (the warm-up decode included).

    python scripts/bench_batch.py                                   # 32 problems, every method, 1..32
    python scripts/bench_batch.py --problems 96 --methods llm_only rstitch --batch-sizes 1 16
    VLLM_ENABLE_V1_MULTIPROCESSING=0 python scripts/bench_batch.py --methods llm_only rstitch --batch-sizes 1 4 16 \
        --override engine=vllm engine.enforce_eager=true engine.block_size=32 \
        engine.per_model.slm.kv_cache_memory_bytes=268435456 engine.per_model.llm.kv_cache_memory_bytes=268435456
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from rstitch.cli.run import compose_config
from rstitch.errors import exit_on_config_error
from rstitch.runner import get_pair, run

METHODS = ("llm_only", "rstitch", "specdec", "rsd", "specreason")
BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def measure(method: str, batch_size: int, args: argparse.Namespace, root: Path) -> dict:
    """One run; its summary's throughput fields and the outputs of its samples."""
    cfg = compose_config([f"method={method}", "logger=none", f"dataset.limit={args.problems}",
                          f"max_new_tokens={args.max_new_tokens}", f"batch_size={batch_size}",
                          "engine.num_threads=1", *args.override])
    cfg.pop("logger")
    cfg.pop("results_root")
    run_dir = root / f"{method}_b{batch_size}"
    models = get_pair(cfg["pair"], cfg["engine"]).models().values()  # loaded once, then the run's own
    before = [_requests(m) for m in models]
    summary = run(cfg, run_dir)
    requests, calls = (sum(_requests(m)[i] - b[i] for m, b in zip(models, before)) for i in (0, 1))
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    outputs = {(r["id"], r["sample_index"]): r["output_token_ids"] for r in rows}
    keys = ("decode_wall_s", "samples_per_s", "decode_tokens_per_s", "tokens", "accuracy", "latency_s")
    generated = sum(len(t) for t in outputs.values())
    return {**{k: summary[k] for k in keys}, "outputs": outputs, "requests_per_token": requests / generated,
            "calls_per_token": calls / generated}


def _requests(model) -> tuple[int, int]:
    """vLLM requests and `generate` calls so far (other engines: none)."""
    return getattr(model, "requests", 0), getattr(model, "generate_calls", 0)


def table(results: dict[tuple[str, int], dict], methods: list[str], sizes: list[int]) -> str:
    vllm = any(r["requests_per_token"] for r in results.values())
    lines = ["| method | batch | decode wall (s) | samples/s | tokens/s | gain over batch 1 | same outputs as batch 1 | latency_s / batch 1's |"
             + (" requests / token | generate calls / token |" if vllm else ""),
             "|---|---:|---:|---:|---:|---:|---|---:|" + ("---:|---:|" if vllm else "")]
    for method in methods:
        base = results[(method, sizes[0])]
        for size in sizes:
            r = results[(method, size)]
            same = "yes" if r["outputs"] == base["outputs"] else _differences(base["outputs"], r["outputs"])
            lines.append(f"| {method} | {size} | {r['decode_wall_s']:.2f} | {r['samples_per_s']:.2f} | "
                         f"{r['decode_tokens_per_s']:.0f} | {base['decode_wall_s'] / r['decode_wall_s']:.2f}x | {same} | "
                         f"{r['latency_s'] / base['latency_s']:.2f} |"
                         + (f" {r['requests_per_token']:.3f} | {r['calls_per_token']:.3f} |" if vllm else ""))
    return "\n".join(lines)


def table6(results: dict[tuple[str, int], dict], sizes: list[int]) -> str:
    """R-Stitch Table 6's view: rstitch against llm_only on the same problems at each batch size."""
    lines = ["| batch | llm_only tokens/s | rstitch tokens/s | rstitch speedup (wall clock) |", "|---:|---:|---:|---:|"]
    for size in sizes:
        llm, ours = results[("llm_only", size)], results[("rstitch", size)]
        lines.append(f"| {size} | {llm['decode_tokens_per_s']:.0f} | {ours['decode_tokens_per_s']:.0f} | "
                     f"{llm['decode_wall_s'] / ours['decode_wall_s']:.2f}x |")
    return "\n".join(lines)


def _differences(base: dict, other: dict) -> str:
    differ = [k for k in base if base[k] != other.get(k)]
    return f"no: {len(differ)} of {len(base)} samples differ"


@exit_on_config_error()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=list(BATCH_SIZES))
    parser.add_argument("--override", nargs="*", default=[], help="more rstitch-run overrides, e.g. decoding.temperature=0.7")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sizes = sorted(set(args.batch_sizes))
    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            for size in sizes:
                start = time.perf_counter()
                results[(method, size)] = r = measure(method, size, args, Path(tmp))
                print(f"{method} batch {size}: decode {r['decode_wall_s']:.2f}s, {r['decode_tokens_per_s']:.0f} tok/s "
                      f"({time.perf_counter() - start:.1f}s with loading)", file=sys.stderr, flush=True)
    print(f"testbed, {args.problems} problems, budget {args.max_new_tokens}, one torch thread, overrides {args.override}\n")
    print(table(results, args.methods, sizes))
    if {"llm_only", "rstitch"} <= set(args.methods):
        print("\n" + table6(results, sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
