"""engine=vllm against engine=hf on the testbed, and against stock `vllm.LLM.generate`: load time,
per-token latency, request counts per method (requests per generated token: one per run of tokens for R-Stitch and the single-model
baselines, one per forward for the other token-level methods; what the lookahead saves, and the
hidden-state requests of rstitch_plus), and the entropy error of top-k logprobs against the full
vocabulary.

    python scripts/bench_vllm.py                    # all of it (needs vLLM importable)
    python scripts/bench_vllm.py --entropy-only     # only the top-k entropy error (HF, no vLLM)
    python scripts/bench_vllm.py --methods rstitch specdec --problems 4 --budget 128
    python scripts/bench_vllm.py --steps-only        # engine steps, requests, host reads per token vs stock

`--steps-only` (also run by default) decodes each method through the engine and the LLM alone
through stock `LLM.generate` (no logits processor, same engine options), and counts per generated
token: vLLM forwards (`execute_model` calls that schedule tokens, both models), requests (and
scoring requests repeated without the prefix cache, which had covered wanted positions), host
reads of tensor values (`.item()`, `int()`, `bool()`, `.tolist()`, `.numpy()` of a tensor, in vLLM
and the project alike: `HostReads`), and the switch processor's log reads (one per run that a
forced sentinel ends); then ms per token (the best of three passes without counting). CPU or GPU alike.

CPU runs want `engine.block_size` 32 (the CPU default of 128 rarely fills on testbed sequences).
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rstitch.data.prompts import PromptFormat
from rstitch.engines import ModelPair, Sampler, SwitchRule, load_pair
from rstitch.engines.vllm import complete_topk, count_engine_steps
from rstitch.errors import exit_on_config_error
from rstitch.methods import DecodeContext, build_method
from rstitch.testbed import ASSETS_DIR, LLM_DIR, SLM_DIR, generate_problems

BENCH_PARAMS = {  # greedy candidates for the search methods; the checkpoints R-Stitch+ reads
    "best_of_n": {"n": 2, "temperature": None}, "maj": {"n": 2, "temperature": None},
    "process_bon": {"n": 2, "temperature": None},
    "beam_search": {"beam_size": 2, "expansions": 2, "temperature": None},
    "rstitch_plus": {"router": str(ASSETS_DIR / "rstitch_router"), "latency_dir": str(ASSETS_DIR / "latency")},
}
DEFAULT_METHODS = ["slm_only", "llm_only", "rstitch", "rstitch_plus", "random", "specdec", "easd", "rsd", "specreason"]
VLLM_OPTIONS = dict(enforce_eager=True, block_size=32, kv_cache_memory_bytes=64 << 20)


def pair_specs() -> tuple[dict, dict]:
    return {"path": str(SLM_DIR), "name": "testbed-slm"}, {"path": str(LLM_DIR), "name": "testbed-llm"}


def prompts(tokenizer, n: int) -> list[tuple[str, list[int]]]:
    return [(p.problem, PromptFormat().encode(tokenizer, p.problem)) for p in generate_problems("test", n, seed=5)]


def decode(pair: ModelPair, name: str, problem: str, prompt: list[int], budget: int):
    ctx = DecodeContext(pair, Sampler(), budget, problem=problem)
    return build_method(name, **BENCH_PARAMS.get(name, {})).decode(prompt, ctx)


def time_methods(pairs: dict[str, ModelPair], methods: list[str], n_problems: int, budget: int) -> None:
    vllm = pairs["vllm"]
    items = prompts(vllm.tokenizer, n_problems)
    print(f"\n{'method':18s} {'tokens':>6s} {'hf ms/tok':>9s} {'vllm ms/tok':>11s} {'ratio':>5s} "
          f"{'forwards':>8s} {'requests':>8s} {'req/tok':>7s} {'served':>6s} {'unused':>6s} {'hidden':>6s} {'same':>4s}")
    for name in methods:
        decode(vllm, name, *items[0], budget=16)  # warm-up
        decode(pairs["hf"], name, *items[0], budget=16)
        counters = lambda: [getattr(m, f) for m in vllm.models().values()  # noqa: E731
                            for f in ("requests", "served_from_lookahead", "lookahead_tokens", "hidden_requests")]
        forwards = lambda: sum(m.cost.forward_calls for m in vllm.models().values())  # noqa: E731
        before, calls_before = counters(), forwards()
        seconds = {"hf": 0.0, "vllm": 0.0}
        outputs: dict[str, list] = {"hf": [], "vllm": []}
        for problem, prompt in items:
            for engine in ("hf", "vllm"):
                start = time.perf_counter()
                outputs[engine].append(decode(pairs[engine], name, problem, prompt, budget).token_ids)
                seconds[engine] += time.perf_counter() - start
        after = counters()
        requests, served, ahead, pooled = (after[i] + after[i + 4] - before[i] - before[i + 4] for i in range(4))
        tokens = sum(len(t) for t in outputs["vllm"])
        hf_ms, vllm_ms = (1000 * seconds[e] / tokens for e in ("hf", "vllm"))
        print(f"{name:18s} {tokens:6d} {hf_ms:9.2f} {vllm_ms:11.2f} {vllm_ms / hf_ms:5.1f} {forwards() - calls_before:8d} "
              f"{requests:8d} {requests / tokens:7.3f} {served:6d} {max(ahead - served, 0):6d} {pooled:6d} "
              f"{str(outputs['hf'] == outputs['vllm']):>4s}")


def best_ms(work, repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def forward_costs(pairs: dict[str, ModelPair], n_tokens: int = 16) -> None:
    """One decode step on HF; one vLLM request that predicts one token after a cached prefix; the
    per-token cost inside a request that decodes `n_tokens` with full logprobs (the lookahead),
    and without logprobs (native `generate`); one hidden-state request for the last position."""
    print(f"\nper-forward cost (best of 20, ms; prompt of a testbed problem, {n_tokens}-token chunks)")
    print(f"{'model':5s} {'hf step':>8s} {'vllm request':>12s} {'lookahead/tok':>13s} {'generate/tok':>12s} "
          f"{'hidden request':>14s}")
    _, prompt = prompts(pairs["hf"].tokenizer, 1)[0]
    for key in ("slm", "llm"):
        forward_cost_row(key, getattr(pairs["hf"], key), getattr(pairs["vllm"], key), prompt, n_tokens)


def forward_cost_row(key: str, hf, vllm, prompt: list[int], n_tokens: int) -> None:
    """One row of `forward_costs`: the costs of one model on both engines."""
    seq = hf.new_sequence(prompt)
    seq.next_distribution()

    def hf_step() -> None:
        seq.append(5)
        seq.next_distribution()
        seq.rollback(1)

    one, chunk = (vllm.scoring_params(n, 1, read_cache=True) for n in (1, n_tokens))
    native = vllm.run_params(n_tokens, Sampler(), (), set(), SwitchRule.never(), vllm.vllm_switch.new_serial())
    request = best_ms(lambda: vllm.run_many([prompt], [one]))
    ahead = (best_ms(lambda: vllm.run_many([prompt], [chunk])) - request) / (n_tokens - 1)
    generate = (best_ms(lambda: vllm.run_many([prompt], [native])) - request) / (n_tokens - 1)
    hidden = best_ms(lambda: vllm.hidden_states(prompt, 1)) if vllm.hidden_llm is not None else math.nan
    print(f"{key:5s} {best_ms(hf_step):8.2f} {request:12.2f} {ahead:13.2f} {generate:12.2f} {hidden:14.2f}")


def entropy_error(pair: ModelPair, n_problems: int, budget: int, ks: list[int], taus: list[float]) -> None:
    """Normalized entropy from the top-k completion against the exact one, at every position of
    greedy SLM and LLM decodes (HF distributions, so no vLLM is needed)."""
    print(f"\ntop-k entropy error over greedy decodes of {n_problems} problems (normalized entropy H / log V);"
          f" flips: positions where H > tau changes, for tau in {taus}")
    print(f"{'model':5s} {'k':>4s} {'positions':>9s} {'mean |err|':>10s} {'max |err|':>10s} {'mean H':>8s}  flips")
    for key, model in pair.models().items():
        rows = []
        for _, prompt in prompts(pair.tokenizer, n_problems):
            seq = model.new_sequence(prompt)
            for _ in range(budget):
                dist = seq.next_distribution()
                rows.append(dist.log_probs)
                if dist.argmax in model.eos_token_ids:
                    break
                seq.append(dist.argmax)
        exact = torch.stack(rows)
        vocab = exact.shape[-1]
        h_exact = -(exact.exp() * exact).nan_to_num().sum(-1) / math.log(vocab)
        for k in ks:
            values, ids = exact.topk(k, dim=-1)
            approx = torch.stack([complete_topk(i, v, vocab) for i, v in zip(ids, values)])
            h_approx = -(approx.exp() * approx).nan_to_num().sum(-1) / math.log(vocab)
            err = (h_approx - h_exact).abs()
            flips = [int(((h_exact > tau) != (h_approx > tau)).sum()) for tau in taus]
            print(f"{key:5s} {k:4d} {len(rows):9d} {float(err.mean()):10.2e} {float(err.max()):10.2e} "
                  f"{float(h_exact.mean()):8.4f}  {flips}")


class HostReads(TorchDispatchMode):
    """Counts reads of tensor values on the host (each one a device sync on a GPU, unless copied
    asynchronously): `aten._local_scalar_dense` (`.item()`, `int()`, `bool()`) through the
    dispatcher, and the `.tolist()` and `.numpy()` calls, which do not pass through it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._patched: dict[str, Callable] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in ("tolist", "numpy"):
            original = self._patched[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def _counted(self, original: Callable) -> Callable:
        def counted(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)
        return counted


def stock_llm(path: str, steps: list[int]):
    """A plain `vllm.LLM` on the same model and engine options, its forwards counted in `steps`."""
    from vllm import LLM

    llm = LLM(model=path, dtype="float32", seed=0, disable_log_stats=True, **VLLM_OPTIONS)
    count_engine_steps(llm, lambda: steps.__setitem__(0, steps[0] + 1))
    return llm


def stock_decoder(llm, eos: list[int], budget: int) -> Callable[[str, list[int]], list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=budget, stop_token_ids=eos, detokenize=False)
    return lambda _, prompt: list(llm.generate([TokensPrompt(prompt_token_ids=prompt)], params,
                                               use_tqdm=False)[0].outputs[0].token_ids)


def step_counts(vllm: ModelPair, methods: list[str], n_problems: int, budget: int, repeats: int = 3) -> None:
    """Engine steps, requests and host reads per token of each method through the engine, and of
    the LLM alone through stock `LLM.generate`; ms per token: the best of `repeats` uncounted passes."""
    from rstitch.engines import vllm_switch

    items = prompts(vllm.tokenizer, n_problems)
    stock_steps = [0]
    stock = stock_decoder(stock_llm(str(LLM_DIR), stock_steps), vllm.llm.eos_token_ids, budget)
    log_reads = [0]
    read_log = vllm_switch.SwitchState.read_log
    vllm_switch.SwitchState.read_log = lambda self, *a: log_reads.__setitem__(0, log_reads[0] + 1) or read_log(self, *a)
    print(f"\nper generated token, {n_problems} problems x {budget} tokens, greedy (steps: vLLM forwards of both"
          f" models; reads: host reads of tensor values; ms: best of {repeats} passes)")
    print(f"{'decoder':22s} {'tokens':>6s} {'steps/tok':>9s} {'req/tok':>7s} {'retries':>7s} {'reads/tok':>9s} "
          f"{'log reads':>9s} {'hash/req':>8s} {'ms/tok':>7s}")
    total = lambda field: sum(getattr(m, field) for m in vllm.models().values())  # noqa: E731
    hashed = lambda: sum(m.block_hasher.hashed_blocks for m in vllm.models().values() if m.block_hasher)  # noqa: E731
    rows: list[tuple[str, Callable[[str, list[int]], list[int]], Callable[[], tuple[int, ...]]]] = [
        ("LLM.generate (stock)", stock, lambda: (stock_steps[0], 0, 0, 0))]
    rows += [(name, lambda problem, prompt, name=name: decode(vllm, name, problem, prompt, budget).token_ids,
              lambda: (total("engine_steps"), total("requests"), total("prefix_cache_retries"), hashed())) for name in methods]
    counted = [count_row(run, counters, items, log_reads) for _, run, counters in rows]
    seconds = [math.inf] * len(rows)
    for _ in range(repeats):  # passes interleaved across the rows, so that load drifts hit all alike
        for i, (_, run, _) in enumerate(rows):
            start = time.perf_counter()
            for item in items:
                run(*item)
            seconds[i] = min(seconds[i], time.perf_counter() - start)
    for (label, _, _), (tokens, steps, requests, retries, blocks, reads, logs), s in zip(rows, counted, seconds):
        print(f"{label:22s} {tokens:6d} {steps / tokens:9.3f} {(requests or len(items)) / tokens:7.3f} "
              f"{retries:7d} {reads / tokens:9.2f} {logs:9d} {blocks / (requests or 1):8.2f} {1000 * s / tokens:7.2f}")
    vllm_switch.SwitchState.read_log = read_log


def count_row(run: Callable, counters: Callable[[], tuple[int, ...]], items: list, log_reads: list[int]) -> tuple:
    """One warm-up decode of the first item, then one counted pass over all: tokens, and the
    engine steps, requests, prefix-cache retries, blocks hashed, host reads and switch-log reads it took."""
    run(*items[0])
    before, reads, logs = counters(), HostReads(), log_reads[0]
    with reads:
        tokens = sum(len(run(*item)) for item in items)
    steps, requests, retries, blocks = (after - b for after, b in zip(counters(), before))
    return tokens, steps, requests, retries, blocks, reads.count, log_reads[0] - logs


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="*", default=DEFAULT_METHODS)
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--ks", type=int, nargs="*", default=[5, 20])
    parser.add_argument("--taus", type=float, nargs="*", default=[0.001, 0.005, 0.01, 0.02, 0.03, 0.05])
    parser.add_argument("--max-lookahead", type=int, default=1)
    parser.add_argument("--llm-max-lookahead", type=int, default=None, help="the LLM's own (default: --max-lookahead)")
    parser.add_argument("--entropy-only", action="store_true")
    parser.add_argument("--steps-only", action="store_true", help="only the per-token counts against stock generate")
    parser.add_argument("--step-methods", nargs="*", default=["llm_only", "slm_only", "rstitch", "specdec"])
    args = parser.parse_args()
    torch.set_num_threads(1)

    if args.steps_only:
        vllm = load_pair(*pair_specs(), engine="vllm", **VLLM_OPTIONS)
        step_counts(vllm, args.step_methods, args.problems, args.budget)
        return
    start = time.perf_counter()
    hf = load_pair(*pair_specs())
    print(f"load hf pair: {time.perf_counter() - start:.1f} s")
    entropy_error(hf, args.problems, args.budget, args.ks, args.taus)
    if args.entropy_only:
        return
    start = time.perf_counter()
    llm_lookahead = args.max_lookahead if args.llm_max_lookahead is None else args.llm_max_lookahead
    vllm = load_pair(*pair_specs(), engine="vllm", max_lookahead=args.max_lookahead,
                     per_model={"llm": {"max_lookahead": llm_lookahead}}, **VLLM_OPTIONS)
    print(f"\nload vllm pair (both engines, first import included): {time.perf_counter() - start:.1f} s")
    if "rstitch_plus" in args.methods:  # it reads hidden states: load both hidden-state engines now
        start = time.perf_counter()
        for model in vllm.models().values():
            model.open_hidden_engine()
        print(f"load both hidden-state engines: {time.perf_counter() - start:.1f} s")
    forward_costs({"hf": hf, "vllm": vllm})
    time_methods({"hf": hf, "vllm": vllm}, args.methods, args.problems, args.budget)
    step_counts(vllm, args.step_methods, args.problems, args.budget)


if __name__ == "__main__":
    main()
