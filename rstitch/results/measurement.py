"""What a latency was measured under, whether that was contention, and what of it still holds
(docs/analysis.md, "Timings on a shared machine")."""
from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from typing import Any

# Contention: a load average (this process's threads included) above this factor x its CPUs, or a CPU decode
# with less CPU time than this per wall-clock second (a busy decode thread gets ~1.0 on a quiet core).
LOAD_PER_CPU_LIMIT = 1.25
MIN_CPU_PER_WALL = 0.8
CONTENTION_ADVICE = ("on a CPU, read the estimated speedup (est_speedup, `speedup_estimate`: the forwards a decode ran, each at "
                     "its cost in the latency model of latency_dir, which other jobs on the cores do not change: docs/analysis.md, "
                     "\"Timings on a shared machine\"), else the CPU-time speedup (cpu_speedup, `speedup_cpu`); a wall-clock latency "
                     "(a GPU's, a batched run's) measured under contention, and any speedup against it, is not a quiet machine's: "
                     "rerun on free cores (delete the run directory, or use another results_root), or keep engine.num_threads to them")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a Slurm allocation), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def sample_measurement(threads: int, device: str, wall_s: float, cpu_s: float | None,
                       cpu_clock: str | None = None) -> dict[str, Any]:
    """What one sample's decode ran under; `cpu_s` read from `cpu_clock` ("thread" or "process"), None when batched."""
    return {"threads": threads, "device": device, "cpus": available_cpus(), "load_1m": os.getloadavg()[0],
            "cpu_s": cpu_s, "cpu_clock": cpu_clock if cpu_s is not None else None,
            "cpu_per_wall": cpu_s / wall_s if cpu_s is not None and wall_s > 0 else None}


def contention(device: str, cpus: int, threads: int, load_1m: float | None, cpu_per_wall: float | None) -> str | None:
    """Why a latency measured under these conditions is not a quiet machine's, or None."""
    reasons = []
    if threads > cpus:
        reasons.append(f"{threads} threads on {cpus} CPUs")
    if load_1m is not None and load_1m > LOAD_PER_CPU_LIMIT * cpus:
        reasons.append(f"load average {load_1m:.1f} on {cpus} CPUs")
    if device.startswith("cpu") and cpu_per_wall is not None and cpu_per_wall < MIN_CPU_PER_WALL:
        reasons.append(f"the decode got {cpu_per_wall:.2f} CPU-seconds per wall-clock second")
    return "; ".join(reasons) or None


def summarize_measurement(samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's `measurement`, aggregated over the samples that record one, and `contention`."""
    measured = [s["measurement"] for s in samples if s.get("measurement")]
    if not measured:
        return {"measurement": None, "contention": None}
    timed = [m for m in measured if m.get("cpu_s") is not None and m.get("cpu_per_wall")]
    wall = sum(m["cpu_s"] / m["cpu_per_wall"] for m in timed)
    loads = [m["load_1m"] for m in measured if m.get("load_1m") is not None]
    summary = {
        "threads": max(m["threads"] for m in measured),
        "device": measured[-1]["device"],
        "cpus": min(m["cpus"] for m in measured),
        "load_1m": statistics.fmean(loads) if loads else None,
        "cpu_per_wall": sum(m["cpu_s"] for m in timed) / wall if wall > 0 else None,
        "samples": len(measured),
    }
    summary["contended_samples"] = sum(
        contention(m["device"], m["cpus"], m["threads"], m.get("load_1m"), m.get("cpu_per_wall")) is not None for m in measured)
    reason = contention(summary["device"], summary["cpus"], summary["threads"], summary["load_1m"], summary["cpu_per_wall"])
    return {"measurement": summary, "contention": reason}


def robust_figure(summary: dict[str, Any]) -> str:
    """What of a contended run still holds: on a CPU its estimated speedup, else its CPU-time one."""
    if summary.get("speedup_estimate") is not None and summary.get("latency_cpu_s") is not None:
        return (f"; its estimated speedup {summary['speedup_estimate']:.2f}x (forwards counted at fitted costs) holds, "
                "its wall-clock one does not")
    if summary.get("speedup_cpu") is not None:
        return f"; its CPU-time speedup {summary['speedup_cpu']:.2f}x holds, its wall-clock one does not"
    if summary.get("latency_cpu_s") is not None:
        return "; its CPU time holds, its wall clock does not"
    return ""


def contention_notes(summaries: Iterable[dict[str, Any]]) -> list[str]:
    """The console's flag: one line per run whose latency was measured under contention, then what to do."""
    lines = [f"! {s.get('method')} {s.get('setting_tag') or s.get('run_tag')}: latency measured under contention ({s['contention']})"
             + robust_figure(s) for s in summaries if s.get("contention")]
    return [*lines, f"! {CONTENTION_ADVICE}"] if lines else []
