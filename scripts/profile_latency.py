"""Profile a pair's per-forward latency on this machine and fit T = a*N_inf*N_kv + b*N_inf^2 + c*N_inf + d.

    python scripts/profile_latency.py                       # testbed pair, CPU -> rstitch/testbed/assets/latency/
    python scripts/profile_latency.py --pair r1_1.5b_7b --max-kv 16384 --max-inf 4096 --out runs/latency
    python scripts/profile_latency.py --pair qwen2.5_coder_0.5b_1.5b --engine llamacpp --threads 2 --out runs/latency-llamacpp

1. For each model, time forwards through the framework's engine over a grid of N_inf (tokens
   processed) x N_kv (cache size before the forward): open a Sequence holding N_kv tokens, append
   N_inf tokens, ask for the next distribution, roll back, repeat. On a CPU a forward is timed on the
   computing thread's CPU clock, which leaves out the time other jobs hold the core (--clock wall:
   the engine's wall-clock forward time, a GPU's), and each shape's time is the minimum of --repeats
   (other jobs on the cores only add time; --statistic median or mean instead). The
   two models are timed interleaved, cache size by cache size, so a change in the machine's speed
   during the profile falls on both alike and their ratio, which a speedup estimate is made of, holds.
2. Fit the coefficients by least squares weighted by 1/T (relative error; decode steps dominate
   trajectories and are the shortest forwards), then the formula's remaining error per profiled
   N_inf (`scale_by_inf`; --formula-only skips it), report R^2 overall and for decode / prefill
   points, and save one JSON per (model, device, dtype) with its points: `--refit` fits the
   saved points again without profiling.
3. Check on real trajectories: decode --check problems (testbed validation split) with R-Stitch
   at a few thresholds, timing each sample like the runner does, and compare the sum of the
   per-forward estimates with the measured wall-clock latency (and with the engine-measured
   forward time, which isolates the fit's error from the decoding loop's own overhead).
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rstitch.config_groups import group_choices, group_config, pair_config, prompt_format
from rstitch.data.prompts import PromptFormat
from rstitch.engines import Sampler, load_pair
from rstitch.errors import exit_on_config_error
from rstitch.latency.model import (
    PROFILE_STATISTICS,
    ForwardTrace,
    LatencyModel,
    ProfilePoint,
    estimate_latency,
    fit_profile,
    profile_runners,
    r_squared,
)
from rstitch.methods import DecodeContext, build_method
from rstitch.testbed import ASSETS_DIR


def grid(maximum: int, start: int) -> list[int]:
    """Dense at the small end (decode steps and short catch-ups), geometric above."""
    values = {0, 1, 2, 3, 4, 6} if start == 0 else {1, 2, 3, 4, 6}
    v = 8
    while v <= maximum:
        values.update({v, int(v * 1.5)})
        v *= 2
    return sorted(x for x in values if start <= x <= maximum)


def fit_report(model, points) -> dict[str, float]:
    """R^2 and mean relative error on all points and separately on decode (N_inf = 1) and prefill
    points, of the prediction and of the formula alone."""
    out = {}
    for name, keep in (("all", lambda p: True), ("decode", lambda p: p.n_inf == 1), ("prefill", lambda p: p.n_inf > 1)):
        sel = [p for p in points if keep(p)]
        measured = np.array([p.seconds for p in sel])
        for prefix, predict in (("", model.predict), ("formula_", model.formula)):
            predicted = np.asarray(predict([p.n_inf for p in sel], [p.n_kv for p in sel]))
            out[f"{prefix}r2_{name}"] = r_squared(predicted, measured)
            out[f"{prefix}mean_abs_rel_error_{name}"] = float(np.mean(np.abs(predicted - measured) / measured))
    return out


def describe(key: str, model, path: Path) -> str:
    return (f"{key} ({model.model}): a={model.a:.3e} b={model.b:.3e} c={model.c:.3e} d={model.d:.3e}  "
            f"R^2 {model.r2:.4f} (decode {model.info['r2_decode']:.3f}, prefill {model.info['r2_prefill']:.4f}); decode "
            f"mean |rel err| {model.info['mean_abs_rel_error_decode']:.3f} (formula alone "
            f"{model.info['formula_mean_abs_rel_error_decode']:.3f}); decode at N_kv=256: "
            f"{1000 * model.predict(1, 256):.2f} ms -> {path}")


def refit(directory: Path, relative: bool, scale_by_inf: bool) -> None:
    """Fit every saved profile in `directory` again from its stored points (no profiling)."""
    files = sorted(directory.glob("*.json"))
    saved = [LatencyModel.load(f) for f in files if not f.name.startswith("trajectory_check")]
    if not any(m.info.get("points") for m in saved):
        raise SystemExit(f"error: no saved profile with points in {directory}")
    for old in saved:
        points = [ProfilePoint(int(n), int(kv), float(s)) for n, kv, s in old.info.get("points", [])]
        if not points:
            continue
        model = fit_profile(points, relative=relative, scale_by_inf=scale_by_inf, identity=(old.model, old.device, old.dtype, old.engine))
        model.info.update(fit_report(model, points))
        model.info.update({k: v for k, v in old.info.items() if k not in model.info and not k.startswith(("r2_", "mean_abs"))})
        model.info["weighting"] = "relative (1/T)" if relative else "unweighted"
        print(describe("refit", model, model.save(model.path_in(directory))))


def profile_clock(choice: str, device: str, threads: int) -> tuple[str, Callable[[], float]] | None:
    """(name, clock) a forward is timed by, or None for the engine's wall-clock forward time: on a
    CPU (`auto`) the decoding thread's CPU clock (the process's with several compute threads), which
    leaves out the time other jobs hold the core; elsewhere wall clock (a GPU computes off the CPU)."""
    if choice == "wall" or (choice == "auto" and not device.startswith("cpu")):
        return None
    return ("thread CPU time", time.thread_time) if threads == 1 else ("process CPU time", time.process_time)


def profile_pair(pair, n_inf_grid: list[int], n_kv_grid: list[int], args: argparse.Namespace) -> dict[str, LatencyModel]:
    """Profile both models of `pair` interleaved (`profile_runners`), fit, save and describe each."""
    runners = pair.models()
    clock = profile_clock(args.clock, str(next(iter(runners.values())).identity.device), args.threads)
    profile_runners(runners, [1, 16], [0, 64], repeats=2)  # warm-up: allocator, kernels
    t0 = time.perf_counter()
    profiled = profile_runners(runners, n_inf_grid, n_kv_grid, repeats=args.repeats, statistic=args.statistic,
                               clock=None if clock is None else clock[1])
    models = {}
    for key, points in profiled.items():
        model = fit_profile(points, runners[key], relative=not args.unweighted, scale_by_inf=not args.formula_only)
        model.info.update(fit_report(model, points))
        model.info.update({"threads": args.threads, "repeats": args.repeats, "statistic": args.statistic,
                           "clock": "wall (engine forward time)" if clock is None else clock[0],
                           "profile_s": time.perf_counter() - t0, "interleaved": sorted(profiled),
                           "weighting": "unweighted" if args.unweighted else "relative (1/T)",
                           "points": [[q.n_inf, q.n_kv, q.seconds] for q in points]})
        path = model.save(model.path_in(args.out))
        models[key] = model
        print(describe(key, model, path))
    return models


def check_trajectories(pair, models, prompt: PromptFormat, n: int, taus: list[float], max_new_tokens: int) -> dict:
    from rstitch.testbed import generate_problems

    problems = generate_problems("validation", n, seed=0)
    rows, decode_times = [], []
    for tau in taus:
        method = build_method("rstitch", tau=tau)
        for p in problems:
            trace = ForwardTrace()
            ctx = DecodeContext(trace.wrap(pair), Sampler(), max_new_tokens)
            ids = prompt.encode(pair.tokenizer, p.problem)
            for m in pair.models().values():
                m.synchronize()
            start = time.perf_counter()
            result = method.decode(ids, ctx)
            for m in pair.models().values():
                m.synchronize()
            measured = time.perf_counter() - start
            decode_times += [f.seconds for f in trace.forwards if f.n_inf == 1]
            rows.append({"tau": tau, "tokens": len(result.token_ids), "tokens_llm": result.tokens_by(1),
                         "measured_s": measured, "forward_time_s": sum(f.seconds for f in trace.forwards),
                         "estimate_s": estimate_latency(trace.forwards, models), "forwards": len(trace.forwards)})
    est = np.array([r["estimate_s"] for r in rows])
    wall = np.array([r["measured_s"] for r in rows])
    fwd = np.array([r["forward_time_s"] for r in rows])
    return {
        "n_samples": len(rows),
        "taus": taus,
        "mean_abs_rel_error_vs_wall": float(np.mean(np.abs(est - wall) / wall)),
        "mean_rel_error_vs_wall": float(np.mean((est - wall) / wall)),  # signed: < 0 = underestimate
        "mean_abs_rel_error_vs_forward_time": float(np.mean(np.abs(est - fwd) / fwd)),
        "total_estimate_over_wall": float(est.sum() / wall.sum()),
        "forward_share_of_wall": float(fwd.sum() / wall.sum()),
        "pearson_estimate_wall": float(np.corrcoef(est, wall)[0, 1]),
        "mean_wall_s": float(wall.mean()),
        # Stalls from other jobs show as a mean well above the median of in-loop decode steps.
        "decode_forward_ms_median": 1000 * float(np.median(decode_times)),
        "decode_forward_ms_mean": 1000 * float(np.mean(decode_times)),
        "samples": rows,
    }


@exit_on_config_error()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="testbed", choices=group_choices("pair"), help="a conf/pair/*.yaml name")
    p.add_argument("--slm", default=None, help="override the pair's SLM path")
    p.add_argument("--llm", default=None, help="override the pair's LLM path")
    p.add_argument("--engine", default="hf", choices=group_choices("engine"),
                   help="a conf/engine/*.yaml name (its defaults; threads from --threads)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--prompt", default="chat", choices=group_choices("prompt"), help="a conf/prompt/*.yaml name (for the trajectory check)")
    p.add_argument("--out", type=Path, default=ASSETS_DIR / "latency")
    p.add_argument("--max-kv", type=int, default=768)
    p.add_argument("--max-inf", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--statistic", default="min", choices=list(PROFILE_STATISTICS),
                   help="per grid point: min (the model's own cost, also beside busy processes), median, or mean "
                        "(keeps stalls caused by other jobs)")
    p.add_argument("--clock", default="auto", choices=["auto", "cpu", "wall"],
                   help="what a forward is timed by: auto = the thread's CPU time on a CPU (other jobs' time on the "
                        "core left out), wall clock on a GPU")
    p.add_argument("--unweighted", action="store_true", help="plain least squares instead of relative error")
    p.add_argument("--formula-only", action="store_true", help="no per-N_inf scale: the formula alone")
    p.add_argument("--refit", action="store_true", help="fit the profiles saved in --out again from their points, then stop")
    p.add_argument("--check", type=int, default=20, help="problems for the trajectory check (0 = skip)")
    p.add_argument("--taus", default="0.001,0.02,0.1", help="R-Stitch thresholds of the trajectory check")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for small models on a shared CPU)")
    args = p.parse_args()
    if args.refit:
        return refit(args.out, relative=not args.unweighted, scale_by_inf=not args.formula_only)
    torch.set_num_threads(args.threads)

    pair_cfg = pair_config(args.pair, args.slm, args.llm)
    device, dtype = args.device or pair_cfg.get("device", "cpu"), args.dtype or pair_cfg.get("dtype", "float32")
    engine = {k: v for k, v in group_config("engine", args.engine).items() if k != "name"}
    if "num_threads" in engine:
        engine["num_threads"] = args.threads
    pair = load_pair(pair_cfg["slm"], pair_cfg["llm"], engine=args.engine, dtype=dtype, device=device, **engine)
    prompt = prompt_format(args.prompt)
    n_inf_grid, n_kv_grid = grid(args.max_inf, 1), grid(args.max_kv, 0)
    print(f"grid: N_inf {n_inf_grid}\n      N_kv {n_kv_grid}\n      x {args.repeats} repeats, {args.threads} thread(s)")

    models = profile_pair(pair, n_inf_grid, n_kv_grid, args)

    if args.check:
        taus = [float(t) for t in args.taus.split(",")]
        check = check_trajectories(pair, models, prompt, args.check, taus, args.max_new_tokens)
        path = args.out / f"trajectory_check.{args.pair}.{models['llm'].device}.{models['llm'].dtype}.json"
        path.write_text(json.dumps(check, indent=1) + "\n")
        print(f"trajectories ({check['n_samples']} samples, mean {check['mean_wall_s']:.3f} s): estimate vs wall-clock "
              f"mean |rel err| {check['mean_abs_rel_error_vs_wall']:.3f} (signed {check['mean_rel_error_vs_wall']:+.3f}), "
              f"vs engine forward time {check['mean_abs_rel_error_vs_forward_time']:.3f}; forwards are "
              f"{check['forward_share_of_wall']:.2f} of wall time; Pearson r {check['pearson_estimate_wall']:.3f}; in-loop decode "
              f"steps median {check['decode_forward_ms_median']:.2f} ms, mean {check['decode_forward_ms_mean']:.2f} ms -> {path}")


if __name__ == "__main__":
    main()
