"""The README's tau sweep on the testbed, on quiet cores and with busy-loop processes on them:
each tau's speedup from wall clock and from the decode's CPU time, per sitting, and how far the
loaded sitting's speedup is from the quiet one's.

    python scripts/bench_contention.py --out /tmp/contention          # quiet, then 2 busy loops
    python scripts/bench_contention.py --out /tmp/contention --busy 2 --sittings loaded

Each sitting runs `rstitch-run -m method.tau=... baseline=auto logger=none` into its own
results root (<out>/<sitting>), as a user would; a sitting whose root already holds the runs
resumes them (nothing decodes) and only reads the summaries again (the load averages printed are
then the re-reading's, not the decode's). The load average is read at the start and the end of
each sitting. docs/analysis.md ("Timings on a shared machine") says how
to read the output.
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


def busy_loop() -> None:
    while True:
        pass


def run_sweep(root: Path, taus: tuple[str, ...]) -> None:
    command = ["rstitch-run", "-m", f"method.tau={','.join(taus)}", "baseline=auto", "logger=none",
               f"results_root={root}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_contention: {' '.join(command)} failed:\n{done.stderr[-2000:]}")


def read_speedups(root: Path) -> dict[str, dict[str, float | None]]:
    """tau -> the run's wall-clock and CPU-time speedups, from its summary.json."""
    out = {}
    for path in sorted(root.glob("testbed/testbed/rstitch/*/summary.json")):
        summary = json.loads(path.read_text())
        tau = str(summary["config"]["method"]["tau"])
        out[tau] = {"wall": summary.get("speedup"), "cpu": summary.get("speedup_cpu"),
                    "cpu_per_wall": (summary.get("measurement") or {}).get("cpu_per_wall")}
    return out


def sitting(root: Path, busy: int, taus: tuple[str, ...]) -> tuple[dict, tuple[float, float]]:
    spinners = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    try:
        load_start = os.getloadavg()[0]
        run_sweep(root, taus)
        load_end = os.getloadavg()[0]
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    return read_speedups(root), (load_start, load_end)


def cell(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:.2f}':>{width}}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the sittings' results roots")
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes in the loaded sitting")
    parser.add_argument("--sittings", nargs="+", default=["quiet", "loaded"], choices=["quiet", "loaded"])
    parser.add_argument("--taus", nargs="+", default=list(TAUS))
    args = parser.parse_args()
    taus = tuple(args.taus)
    results = {}
    for name in args.sittings:
        speedups, (start, end) = sitting(args.out / name, args.busy if name == "loaded" else 0, taus)
        results[name] = speedups
        print(f"{name}: {args.busy if name == 'loaded' else 0} busy loops, load average {start:.2f} at the start, "
              f"{end:.2f} at the end, on {os.cpu_count()} CPUs")
    print(f"{'tau':>6}  " + "  ".join(f"{n + ' wall':>12}  {n + ' cpu':>12}  {n + ' cpu/wall':>14}" for n in results)
          + ("  loaded/quiet wall  loaded/quiet cpu" if len(results) == 2 else ""))
    for tau in taus:
        cells = []
        for speedups in results.values():
            row = speedups.get(tau, {})
            cells += [cell(row.get("wall"), 12), cell(row.get("cpu"), 12), cell(row.get("cpu_per_wall"), 14)]
        line = f"{tau:>6}  " + "  ".join(cells)
        if len(results) == 2:
            quiet, loaded = results["quiet"].get(tau, {}), results["loaded"].get(tau, {})
            line += f"  {ratio(loaded.get('wall'), quiet.get('wall')):>17}  {ratio(loaded.get('cpu'), quiet.get('cpu')):>16}"
        print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
