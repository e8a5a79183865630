"""Attack the code sandbox as a hostile model solution would and print what each attack achieved.

Classes: 1 outputs read back through links or FIFOs, 2 wrong solutions graded right, 3 memory,
processes and disk beyond the limit for the sample as a whole, 4 host command lines in /proc,
5 host files read (a world-readable file beside the project, /etc/passwd) or left behind.
Safe on a shared machine: small sizes (at most 4 x 64 MiB of memory, 10 MiB of disk, 40 short
processes), each attack abandoned after ``--outer-timeout`` seconds, the whole probe ended by an
alarm after ``--total-timeout``. The logic is rstitch/grading/sandbox_probe.py.

    python scripts/probe_sandbox.py [--outer-timeout 20] [--total-timeout 300]
"""
from __future__ import annotations

import argparse
import os
import signal

from rstitch.errors import exit_on_config_error
from rstitch.grading.sandbox_probe import report, run_probes


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outer-timeout", type=float, default=20.0, help="seconds before one attack is abandoned")
    parser.add_argument("--total-timeout", type=int, default=300, help="seconds before the whole probe ends")
    args = parser.parse_args()
    if args.outer_timeout <= 0 or args.total_timeout <= 0:
        parser.error("timeouts must be > 0")
    signal.alarm(args.total_timeout)
    outcomes = run_probes(args.outer_timeout)
    print(report(outcomes), flush=True)
    # a thread stuck on an attack (a FIFO open) must not keep the probe alive
    os._exit(0 if all(o.contained for o in outcomes) else 1)


if __name__ == "__main__":
    main()
