"""SpecReason's judge time per step on the testbed, in wall-clock and CPU time, for both judge
contexts (docs/step-level.md, "SpecReason"):

    python scripts/bench_judge.py --limit 20 --threshold 7 --rounds 1

Each context decodes the first `--limit` test problems into a fresh results root (nothing is
resumed; a temporary folder), one engine thread, greedy. The library reports the judge's forward wall time
(`judge_time_s`); this script also times each judgement's whole span (`CostMeter.judging`) on the
wall clock and on the decoding thread's CPU clock, which other jobs on the cores do not advance.
The contexts run in the order chat, reasoning, reasoning, chat (`--rounds` times), so that a
load that drifts during the sitting weighs on both alike; the load average is read before and after
each run. The table covers the problems where the judge rejected at least one step (the base model
wrote it): per context over all its runs, then per run.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rstitch.config_groups import compose_config
from rstitch.errors import exit_on_config_error
from rstitch.methods.steps import CostMeter
from rstitch.results.keys import run_dir
from rstitch.runner import run_config

CONTEXTS = ("chat", "reasoning")
METERS: list[CostMeter] = []  # every sample's meter (the warm-up's first), in the order they started
TIMES: dict[int, list[tuple[float, float]]] = {}  # id(meter) -> (wall s, CPU s) of each judgement


def instrument() -> None:
    """Time every judgement on both clocks (one engine thread: the decoding thread's CPU time is
    the judge's); the library's own meter runs unchanged inside."""
    original_init, original_judging = CostMeter.__init__, CostMeter.judging

    def init(self: CostMeter, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        METERS.append(self)
        TIMES[id(self)] = []

    @contextmanager
    def judging(self: CostMeter) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        with original_judging(self):
            yield
        TIMES[id(self)].append((time.perf_counter() - wall, time.thread_time() - cpu))

    CostMeter.__init__ = init  # type: ignore[method-assign]
    CostMeter.judging = judging  # type: ignore[method-assign]


def decode(context: str, limit: int, threshold: float,
           root: Path) -> tuple[list[dict[str, Any]], list[list[tuple[float, float]]], tuple[float, float]]:
    """The samples of one context's run into the empty results root `root`, each sample's judgement
    times, and the 1-min load before and after."""
    cfg = compose_config(["method=specreason", f"method.judge_context={context}", f"method.threshold={threshold}",
                          f"dataset.limit={limit}", "engine.num_threads=1", "logger=none", f"results_root={root}"])
    METERS.clear()
    TIMES.clear()
    load_before = os.getloadavg()[0]
    run_config(cfg)
    load_after = os.getloadavg()[0]
    samples = [json.loads(line) for line in (run_dir(root, cfg) / "samples.jsonl").read_text().splitlines()]
    times = [TIMES[id(m)] for m in METERS[-len(samples):]]  # the warm-up decode's meter comes first
    for sample, judged in zip(samples, times):
        if len(judged) != sample["stats"]["drafted_steps"]:
            raise SystemExit(f"bench_judge: problem {sample['id']}: {len(judged)} judgements timed, "
                             f"{sample['stats']['drafted_steps']} drafted steps recorded")
    return samples, times, (load_before, load_after)


def row(label: str, samples: list[dict[str, Any]], times: list[list[tuple[float, float]]]) -> str:
    steps = [t for judged in times for t in judged]
    wall, cpu = sum(w for w, _ in steps), sum(c for _, c in steps)
    stats = [s["stats"] for s in samples]
    forwards = sum(s.get("judge_time_s") or 0.0 for s in stats)
    tokens = sum(s.get("judge_tokens") or 0 for s in stats)
    rejected = sum(s.get("escalations") or 0 for s in stats)
    n, problems = max(len(steps), 1), max(len(samples), 1)
    latency = sum(s["latency_s"] for s in samples) / problems
    latency_cpu = sum(s["measurement"]["cpu_s"] for s in samples) / problems
    return (f"| {label} | {len(samples)} | {len(steps)} | {rejected} | {wall / n:.4f} | {cpu / n:.4f} | "
            f"{cpu / wall if wall else float('nan'):.2f} | {forwards / n:.4f} | {tokens / n:.1f} | "
            f"{latency:.3f} | {latency_cpu:.3f} |")


HEADER = ("| judge_context | problems | judgements | rejected | judge wall s per step | judge CPU s per step | "
          "CPU s per wall s | judge forwards wall s per step | judge tokens per step | latency per problem (wall s) | "
          "latency per problem (CPU s) |\n" + "|---" * 11 + "|")


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20, help="first N test problems (default 20)")
    parser.add_argument("--threshold", type=float, default=7.0, help="SpecReason's acceptance threshold (default 7)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of chat, reasoning, reasoning, chat (default 1)")
    args = parser.parse_args()
    instrument()
    order = [c for _ in range(args.rounds) for c in (*CONTEXTS, *reversed(CONTEXTS))]  # ABBA: a drifting load hits both alike
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_judge_") as scratch:
        for index, context in enumerate(order, start=1):
            samples, times, (before, after) = decode(context, args.limit, args.threshold, Path(scratch) / f"run{index}")
            runs.append((f"{context} (run {index}, load {before:.1f}-{after:.1f})", context, samples, times))
    print(f"{os.cpu_count()} CPUs; 1-min load average before-after each run")
    rejecting = {s["id"] for *_, samples, _ in runs for s in samples if (s["stats"].get("escalations") or 0) > 0}
    print(f"\nproblems where the judge rejected a step: {len(rejecting)} of {args.limit}\n{HEADER}")
    for context in CONTEXTS:
        pooled = [(s, t) for _, c, samples, times in runs if c == context for s, t in zip(samples, times) if s["id"] in rejecting]
        print(row(f"{context} (all runs)", [s for s, _ in pooled], [t for _, t in pooled]))
    for label, _, samples, times in runs:
        chosen = [i for i, s in enumerate(samples) if s["id"] in rejecting]
        print(row(label, [samples[i] for i in chosen], [times[i] for i in chosen]))
    outputs = {c: {tuple(s["output_token_ids"]) for _, k, samples, _ in runs if k == c for s in samples} for c in CONTEXTS}
    print(f"\nsame outputs in both contexts: {outputs['chat'] == outputs['reasoning']}")


if __name__ == "__main__":
    main()
