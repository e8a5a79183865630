"""Per-token cost of the HF engine on a GPU, eager against the static/compiled path (docs/gpu.md),
with HF `generate` as the anchor and the weights' bandwidth floor, in one run:

* ms per generated token of each model (greedy, batch 1, after its prefill) on each engine path,
  and the per-token ratio LLM / SLM;
* HF `generate` per token, eager (DynamicCache) and compiled (static cache + torch.compile);
* the bandwidth floor: weight bytes / the device's measured copy bandwidth;
* `random` p=0.5 (a model switch at every other token, each with a catch-up prefill) per token
  against the ideal mix 0.5 x t_slm + 0.5 x t_llm;
* LLM throughput at batch sizes (continuous batching, engines/batching.py) against HF `generate`'s.

    python scripts/bench_gpu.py --random-weights --tokenizer .gpu/tok                 # the R-Stitch pair's shapes, offline
    python scripts/bench_gpu.py --pair l1_short_r1_7b                                  # real weights (hub or local paths)
    python scripts/bench_gpu.py --random-weights --tiny --device cpu --dtype float32 --tokens 16 --batch-sizes 1 4 --hf eager
                                                         # a CPU dry run: 2-layer models, engine.compile=static and off

`--random-weights` builds random Qwen2 models with the exact shapes of `--shapes` (the R-Stitch
pair L1-1.5B-Short / DeepSeek-R1-Distill-Qwen-7B) and a tokenizer directory (default: the
testbed's; on a GPU the Qwen2.5 tokenizer from ../shared/gpu/bundle.sh): outputs are noise, but
weight bytes, kernel shapes and per-token cost are the real models'. The engine paths default to
`graphs` then `off` on CUDA, `static` then `off` elsewhere (the same static path without capture).
Each section reports its own failure in one line and the run goes on; the exit status is 1 if
any failed. `--json` writes every number after every section, and a run stopped by SIGTERM (a
`timeout`) prints the report of what it measured. Steps captured inside a timed region are
counted (`captures_in_timed`): capture belongs in warm-up, so any count there taints the timing.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rstitch.config_groups import group_config
from rstitch.engines import ModelPair, Sampler, load_pair
from rstitch.engines.batching import BatchScheduler
from rstitch.errors import exit_on_config_error
from rstitch.methods import DecodeContext, build_method
from rstitch.testbed import TOKENIZER_DIR

# Qwen2 shapes of the R-Stitch pair (config.json of the hub checkpoints).
SHAPES = {
    "slm": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                num_attention_heads=12, num_key_value_heads=2, name="L1-1.5B-Short-shape"),
    "llm": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, name="R1-Distill-Qwen-7B-shape"),
}
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether in April and May? Think step by step. ") * 2


@exit_on_config_error()
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    results: dict[str, Any] = {"command": " ".join(["python", "scripts/bench_gpu.py", *(argv or sys.argv[1:])]),
                               "device": device_name(device), "torch": torch.__version__, "dtype": args.dtype,
                               "tokens": args.tokens}
    import transformers

    results["transformers"] = transformers.__version__
    print(f"# {results['device']}, torch {torch.__version__}, transformers {transformers.__version__}, {args.dtype}, "
          f"{args.tokens} tokens per measurement")
    signal.signal(signal.SIGTERM, stopped)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            specs = random_pair(Path(scratch), args) if args.random_weights else pair_specs(args.pair)
            section(results, "bandwidth", lambda: copy_bandwidth(device), args.json)
            section(results, "sampling", lambda: sampling_cost(device), args.json)
            for path in args.paths:
                section(results, f"engine[{path}]", lambda path=path: engine_path(specs, path, args, results), args.json)
            eager_pair: list[ModelPair] = []  # loaded once for every anchor
            for anchor in args.hf:
                section(results, f"hf_generate[{anchor}]", lambda anchor=anchor: hf_anchor(specs, anchor, args, eager_pair), args.json)
    finally:
        report(results, args)
    return 1 if failures(results) else 0


def stopped(signum: int, frame: Any) -> None:
    """SIGTERM (a `timeout`): stop, report what was measured, exit as `timeout` does."""
    print(f"# stopped by signal {signum}", flush=True)
    raise SystemExit(124)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="l1_short_r1_7b", help="a conf/pair name (real weights; ignored with --random-weights)")
    p.add_argument("--random-weights", action="store_true", help="random models of the pair's shapes (offline)")
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER_DIR, help="tokenizer directory for --random-weights")
    p.add_argument("--tiny", action="store_true", help="2-layer models of the real vocabularies: a dry run")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokens", type=int, default=256, help="generated tokens per measurement")
    p.add_argument("--paths", nargs="*", default=None,
                   help="engine.compile values to measure (default: graphs off on CUDA, static off elsewhere; none: HF generate only)")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--hf", nargs="*", default=["eager", "compiled"], help="HF generate anchors to measure")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.paths is None:
        args.paths = ["graphs" if args.device.startswith("cuda") else "static", "off"]
    return args


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def section(results: dict, name: str, fn: Callable[[], Any], json_path: Path | None) -> None:
    """Run one part of the benchmark; a failure is one line in the report, not the end of the run.
    The JSON is rewritten after each part, so a run cut short keeps what it measured."""
    start = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as err:  # noqa: BLE001 - every failure is reported, the other sections still run
        traceback.print_exc(file=sys.stderr)
        results[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    print(f"# {name}: {time.perf_counter() - start:.1f} s", flush=True)
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2) + "\n")


# --- models -----------------------------------------------------------------------------------
def random_pair(out: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Random-weight Qwen2 models of the pair's shapes, saved with the tokenizer; their load specs."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    specs = {}
    for role, shape in SHAPES.items():
        shape = dict(shape)
        name = shape.pop("name")
        if args.tiny:
            shape.update(TINY)
        config = Qwen2Config(**shape, tie_word_embeddings=False, max_position_embeddings=32768,
                             rms_norm_eps=1e-6, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        torch.manual_seed(0 if role == "slm" else 1)
        with torch.device(args.device):
            model = Qwen2ForCausalLM(config).to(getattr(torch, args.dtype))
        model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        model.save_pretrained(out / role)
        tokenizer.save_pretrained(out / role)
        del model
        specs[role] = {"path": str(out / role), "name": name}
    return specs


def pair_specs(pair: str) -> dict[str, dict]:
    cfg = group_config("pair", pair)
    return {"slm": dict(cfg["slm"]), "llm": dict(cfg["llm"])}


def load(specs: dict[str, dict], path: str, args: argparse.Namespace) -> ModelPair:
    return load_pair(specs["slm"], specs["llm"], dtype=args.dtype, device=args.device, compile=path)


def prompt_ids(pair: ModelPair, salt: int = 0) -> list[int]:
    return pair.tokenizer.encode(f"Problem {salt}. {PROMPT}")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- measurements -------------------------------------------------------------------------------
def copy_bandwidth(device: torch.device) -> dict[str, float]:
    """Bytes read plus written per second by a large device-to-device copy."""
    n = (1 << 28) if device.type == "cuda" else (1 << 24)  # 1 GiB / 64 MiB of float32
    src, dst = torch.ones(n, device=device), torch.empty(n, device=device)
    dst.copy_(src)
    sync(device)
    repeats = 20 if device.type == "cuda" else 5
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    seconds = time.perf_counter() - start
    return {"bytes_per_s": 2 * 4 * n * repeats / seconds}


def sampling_cost(device: torch.device, vocab: int = 152064, repeats: int = 50) -> dict[str, float]:
    """ms per sampled token of the host draw (temperature 0.6, top-p 0.95: probabilities on the
    device, copied to the host, drawn there) against a greedy argmax read back."""
    logits = torch.randn(vocab, device=device, generator=None)
    sampler = Sampler(temperature=0.6, top_p=0.95, seed=0)
    out = {}
    for name, pick in (("greedy_ms", lambda: int(logits.argmax())),
                       ("sampled_ms", lambda: sampler.sample_from(sampler.probs_from_logits(logits)))):
        pick()
        sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            pick()
        sync(device)
        out[name] = 1000 * (time.perf_counter() - start) / repeats
    return out


def captures(pair: ModelPair) -> int:
    """Steps captured or compiled so far by both models (0 on the eager and the uncaptured path)."""
    return sum(getattr(runner.static, "captured", 0) for runner in pair.models().values())  # type: ignore[attr-defined]


def per_token_ms(pair: ModelPair, role: str, tokens: int, timed_captures: list[int]) -> tuple[float, list[int]]:
    """Greedy decode of `tokens` tokens at batch 1 after the prompt's prefill (EOS ignored)."""
    runner = getattr(pair, role)
    warm = runner.new_sequence(prompt_ids(pair, 1))
    warm.generate(8, Sampler(), eos_ids=())  # captures the decode step where the path does
    del warm
    seq = runner.new_sequence(prompt_ids(pair, 2))
    seq.next_distribution()
    runner.synchronize()
    before, start = captures(pair), time.perf_counter()
    out = seq.generate(tokens, Sampler(), eos_ids=())
    runner.synchronize()
    seconds = time.perf_counter() - start
    timed_captures.append(captures(pair) - before)
    assert len(out.token_ids) == tokens
    return 1000 * seconds / tokens, out.token_ids


def random_mix(pair: ModelPair, tokens: int, timed_captures: list[int]) -> dict[str, float]:
    """`random` p=0.5 per generated token (its catch-up prefills included)."""
    method = build_method("random", p=0.5, seed=0)
    method.decode(prompt_ids(pair, 3), DecodeContext(pair, Sampler(), 16))  # warm-up: captures the buckets it meets
    for runner in pair.models().values():
        runner.synchronize()
    before, start = captures(pair), time.perf_counter()
    result = method.decode(prompt_ids(pair, 4), DecodeContext(pair, Sampler(), tokens))
    for runner in pair.models().values():
        runner.synchronize()
    seconds = time.perf_counter() - start
    timed_captures.append(captures(pair) - before)
    n = len(result.token_ids)
    return {"ms_per_token": 1000 * seconds / n, "tokens": n,
            "slm_share": sum(s == 0 for s in result.sources) / n}


def engine_throughput(pair: ModelPair, batch: int, tokens: int, timed_captures: list[int]) -> float:
    """LLM tokens per second with `batch` greedy samples in flight (continuous batching)."""
    runner = pair.llm

    def job(salt: int, n: int) -> Callable[[], int]:
        return lambda: len(runner.new_sequence(prompt_ids(pair, salt)).generate(n, Sampler(), eos_ids=()).token_ids)

    list(BatchScheduler(batch).run([(i, job(100 + i, 4)) for i in range(batch)]))  # warm-up at this batch size
    runner.synchronize()
    before, start = captures(pair), time.perf_counter()
    done = sum(f.value for f in BatchScheduler(batch).run([(i, job(200 + i, tokens)) for i in range(batch)]))
    runner.synchronize()
    seconds = time.perf_counter() - start
    timed_captures.append(captures(pair) - before)
    return done / seconds


def engine_path(specs: dict[str, dict], path: str, args: argparse.Namespace, results: dict) -> dict[str, Any]:
    pair = load(specs, path, args)
    out: dict[str, Any] = {}
    timed: list[int] = []  # steps captured inside each timed region
    if "weight_bytes" not in results:
        results["weight_bytes"] = {role: sum(p.numel() * p.element_size() for p in r.model.parameters())
                                   for role, r in pair.models().items()}
    for role in ("slm", "llm"):
        out[f"{role}_ms"], out[f"{role}_tokens"] = per_token_ms(pair, role, args.tokens, timed)
        print(f"  {path}: {role} {out[f'{role}_ms']:.2f} ms/token", flush=True)
    out["random_p0.5"] = random_mix(pair, args.tokens, timed)
    for batch in args.batch_sizes:
        out[f"tokens_per_s_b{batch}"] = engine_throughput(pair, batch, args.tokens, timed)
        print(f"  {path}: batch {batch} {out[f'tokens_per_s_b{batch}']:.1f} tokens/s", flush=True)
    static = pair.llm.static  # type: ignore[attr-defined]
    out["captured_steps_llm"] = static.captured if static is not None else 0
    out["captures_in_timed"] = sum(timed)
    return out


def hf_anchor(specs: dict[str, dict], anchor: str, args: argparse.Namespace, loaded: list[ModelPair]) -> dict[str, Any]:
    """HF `generate` on the same weights (`anchor` eager: DynamicCache; compiled: static cache and
    torch.compile): per token at batch 1 (generate of N tokens minus one of 1, over N - 1), and
    LLM tokens per second at each batch size. `loaded` keeps the pair for the next anchor."""
    if not loaded:
        loaded.append(load(specs, "off", args))
    pair = loaded[0]
    options = {"cache_implementation": "static"} if anchor == "compiled" else {}
    out: dict[str, Any] = {}
    for role in ("slm", "llm"):
        out[f"{role}_ms"] = 1000 * _hf_per_token(getattr(pair, role).model, prompt_ids(pair, 2), args, options)
        print(f"  hf {anchor}: {role} {out[f'{role}_ms']:.2f} ms/token", flush=True)
    for batch in args.batch_sizes:
        ids = [prompt_ids(pair, 5)] * batch
        seconds = _hf_generate(pair.llm.model, ids, args.tokens, options, args) - _hf_generate(pair.llm.model, ids, 1, options, args)
        out[f"tokens_per_s_b{batch}"] = batch * (args.tokens - 1) / seconds
        print(f"  hf {anchor}: batch {batch} {out[f'tokens_per_s_b{batch}']:.1f} tokens/s", flush=True)
    return out


def _hf_per_token(model: Any, ids: list[int], args: argparse.Namespace, options: dict) -> float:
    full = _hf_generate(model, [ids], args.tokens, options, args)
    return (full - _hf_generate(model, [ids], 1, options, args)) / (args.tokens - 1)


def _hf_generate(model: Any, rows: list[list[int]], tokens: int, options: dict, args: argparse.Namespace) -> float:
    """Seconds of one `generate` of exactly `tokens` tokens (the faster of two), after one untimed
    call of the same shape."""
    input_ids = torch.tensor(rows, device=args.device)
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                  attention_mask=torch.ones_like(input_ids), **options)
    with torch.inference_mode():
        model.generate(input_ids, **kwargs)  # compiles where the cache is static
        times = []
        for _ in range(2):
            sync(torch.device(args.device))
            start = time.perf_counter()
            model.generate(input_ids, **kwargs)
            sync(torch.device(args.device))
            times.append(time.perf_counter() - start)
    return min(times)


# --- report -------------------------------------------------------------------------------------
def report(results: dict, args: argparse.Namespace) -> None:
    rows: list[tuple[str, Any, Any]] = []
    floor = None
    if "bytes_per_s" in results.get("bandwidth", {}) and "weight_bytes" in results:
        bw = results["bandwidth"]["bytes_per_s"]
        floor = {r: 1000 * b / bw for r, b in results["weight_bytes"].items()}
        rows.append((f"weights / copy bandwidth ({bw / 1e12:.2f} TB/s)", floor["slm"], floor["llm"]))
    for path in args.paths:
        got = results.get(f"engine[{path}]", {})
        if "slm_ms" in got:
            rows.append((f"rstitch HF engine, engine.compile={path}", got["slm_ms"], got["llm_ms"]))
    for anchor in args.hf:
        hf = results.get(f"hf_generate[{anchor}]", {})
        if "slm_ms" in hf:
            rows.append((f"HF generate, {anchor}", hf["slm_ms"], hf["llm_ms"]))
    print(f"\n| ms per generated token ({results['device']}, {args.dtype}, batch 1) | SLM | LLM | ratio |")
    print("|---|---|---|---|")
    for label, slm, llm in rows:
        print(f"| {label} | {slm:.2f} | {llm:.2f} | {llm / slm:.2f} |")
    print("\n| random p=0.5 | ms per token | ideal mix 0.5 t_slm + 0.5 t_llm | ratio |")
    print("|---|---|---|---|")
    for path in args.paths:
        got = results.get(f"engine[{path}]", {})
        if "random_p0.5" in got:
            ideal = 0.5 * got["slm_ms"] + 0.5 * got["llm_ms"]
            mix = got["random_p0.5"]["ms_per_token"]
            print(f"| engine.compile={path} | {mix:.2f} | {ideal:.2f} | {mix / ideal:.2f} |")
    print("\n| LLM tokens/s | " + " | ".join(f"batch {b}" for b in args.batch_sizes) + " |")
    print("|---|" + "---|" * len(args.batch_sizes))
    for path in args.paths:
        got = results.get(f"engine[{path}]", {})
        print(f"| engine.compile={path} | " + " | ".join(_fmt(got.get(f"tokens_per_s_b{b}")) for b in args.batch_sizes) + " |")
    for anchor in args.hf:
        hf = results.get(f"hf_generate[{anchor}]", {})
        print(f"| HF generate, {anchor} | " + " | ".join(_fmt(hf.get(f"tokens_per_s_b{b}")) for b in args.batch_sizes) + " |")
    sampling = results.get("sampling", {})
    if "sampled_ms" in sampling:
        print(f"\nhost sampling (V=152064, T=0.6, top-p 0.95): {sampling['sampled_ms']:.3f} ms per sampled token "
              f"against {sampling['greedy_ms']:.3f} ms for a greedy argmax")
    base = results.get("engine[off]", {})
    for path in args.paths:
        got = results.get(f"engine[{path}]", {})
        if path == "off" or "llm_tokens" not in got or "llm_tokens" not in base:
            continue
        for role in ("slm", "llm"):
            a, b = base[f"{role}_tokens"], got[f"{role}_tokens"]
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            agree = sum(x == y for x, y in zip(a, b))
            print(f"agreement with the eager path, {path} {role}: {agree}/{len(a)} positions equal, "
                  f"first difference at {'none' if first is None else first}")
    for path in args.paths:
        timed = results.get(f"engine[{path}]", {}).get("captures_in_timed")
        if timed:
            print(f"WARNING engine.compile={path}: {timed} steps captured inside timed regions (their times include capture)")
    for name, error in failures(results).items():
        print(f"FAILED {name}: {error}")


def failures(results: dict) -> dict[str, str]:
    return {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
