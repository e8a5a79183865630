"""The README's tau sweep on the testbed, on quiet cores and with busy-loop processes on them:
each tau's speedup from wall clock, from the decode's CPU time and from the latency model's
estimate, per sitting, and how far the loaded sitting's speedups are from the quiet one's.

    python scripts/bench_contention.py --out /tmp/contention --refit  # quiet, then 2 busy loops
    python scripts/bench_contention.py --out /tmp/contention --busy 2 --sittings loaded

Each sitting runs `rstitch-run -m method.tau=... baseline=auto logger=none` into its own
results root (<out>/<sitting>), as a user would; a sitting whose root already holds the runs
resumes them (nothing decodes) and only reads the summaries again (the load averages printed are
then the re-reading's, not the decode's). The load average is read at the start and the end of
each sitting.

The estimate's speedup (`speedup_estimate`) is the forwards each decode ran, each at the cost the
latency model gives it. With the shipped profile (rstitch/testbed/assets/latency) it is the same in
every sitting by construction (the decodes are deterministic); `--refit` profiles the testbed's
two models in each sitting first, beside that sitting's busy loops (scripts/profile_latency.py
into <out>/<sitting>/latency, minimum over --repeats per forward shape), and runs the sweep with
`latency_dir=` that profile: the check that a profile fitted on busy cores gives the same speedups
as a quiet one's. docs/analysis.md ("Timings on a shared machine") says how to read the output.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

TAUS = ("0.001", "0.01", "0.02", "0.03")  # README: rstitch-run -m method.tau=0.001,0.01,0.02,0.03
FIGURES = ("wall", "cpu", "estimate")  # the speedups compared, by summary key below
SUMMARY_KEYS = {"wall": "speedup", "cpu": "speedup_cpu", "estimate": "speedup_estimate"}
PROFILE = Path(__file__).resolve().parent / "profile_latency.py"


def busy_loop() -> None:
    while True:
        pass


def run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_contention: {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def refit_profile(latency_dir: Path, repeats: int) -> list[str]:
    """Profile the testbed's models on this sitting's cores into `latency_dir`; the fits' lines."""
    out = run([sys.executable, str(PROFILE), "--pair", "testbed", "--out", str(latency_dir), "--check", "0",
               "--repeats", str(repeats), "--statistic", "min"])
    return [line for line in out.splitlines() if line.startswith(("slm", "llm"))]


def run_sweep(root: Path, taus: tuple[str, ...], latency_dir: Path | None) -> None:
    command = ["rstitch-run", "-m", f"method.tau={','.join(taus)}", "baseline=auto", "logger=none",
               f"results_root={root}"] + ([f"latency_dir={latency_dir}"] if latency_dir else [])
    run(command)


def read_speedups(root: Path) -> dict[str, dict[str, float | None]]:
    """tau -> the run's wall-clock, CPU-time and estimated speedups, from its summary.json."""
    out = {}
    for path in sorted(root.glob("testbed/testbed/rstitch/*/summary.json")):
        summary = json.loads(path.read_text())
        tau = str(summary["config"]["method"]["tau"])
        out[tau] = {figure: summary.get(key) for figure, key in SUMMARY_KEYS.items()}
        out[tau]["cpu_per_wall"] = (summary.get("measurement") or {}).get("cpu_per_wall")
    return out


def sitting(root: Path, busy: int, taus: tuple[str, ...], refit_repeats: int | None) -> dict:
    """One sitting under `busy` busy loops: the profile (with --refit), then the sweep."""
    spinners = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    try:
        load_start = os.getloadavg()[0]
        latency_dir = root / "latency" if refit_repeats else None
        fits = refit_profile(latency_dir, refit_repeats) if latency_dir and refit_repeats else []
        load_profiled = os.getloadavg()[0]
        run_sweep(root, taus, latency_dir)
        load_end = os.getloadavg()[0]
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    return {"speedups": read_speedups(root), "loads": (load_start, load_profiled, load_end), "fits": fits}


def cell(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:.2f}':>{width}}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def print_table(results: dict[str, dict], taus: tuple[str, ...]) -> None:
    """Per tau: each sitting's speedups, then the loaded/quiet ratio of each."""
    both = set(results) == {"quiet", "loaded"}
    header = [f"{name} {figure}" for name in results for figure in (*FIGURES, "cpu/wall")]
    header += [f"loaded/quiet {figure}" for figure in FIGURES] if both else []
    print(f"{'tau':>6}  " + "  ".join(f"{h:>{max(12, len(h))}}" for h in header))
    for tau in taus:
        cells = [cell(result["speedups"].get(tau, {}).get(figure), max(12, len(f"{name} {figure}")))
                 for name, result in results.items() for figure in (*FIGURES, "cpu_per_wall")]
        if both:
            quiet, loaded = (results[n]["speedups"].get(tau, {}) for n in ("quiet", "loaded"))
            cells += [f"{ratio(loaded.get(f), quiet.get(f)):>{len('loaded/quiet ' + f)}}" for f in FIGURES]
        print(f"{tau:>6}  " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the sittings' results roots")
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes in the loaded sitting")
    parser.add_argument("--sittings", nargs="+", default=["quiet", "loaded"], choices=["quiet", "loaded"])
    parser.add_argument("--taus", nargs="+", default=list(TAUS))
    parser.add_argument("--refit", action="store_true",
                        help="profile the testbed's latency in each sitting and run its sweep with that profile")
    parser.add_argument("--repeats", type=int, default=7, help="with --refit: repeats per forward shape (the minimum is kept)")
    args = parser.parse_args()
    taus = tuple(args.taus)
    results = {}
    for name in args.sittings:
        busy = args.busy if name == "loaded" else 0
        results[name] = sitting(args.out / name, busy, taus, args.repeats if args.refit else None)
        start, profiled, end = results[name]["loads"]
        print(f"{name}: {busy} busy loops, load average {start:.2f} at the start, "
              + (f"{profiled:.2f} after profiling, " if args.refit else "")
              + f"{end:.2f} at the end, on {os.cpu_count()} CPUs", flush=True)
        for line in results[name]["fits"]:
            print(f"  {name} profile: {line}")
    print_table(results, taus)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
