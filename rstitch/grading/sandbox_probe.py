"""Probe the code sandbox as a hostile model solution would: the attack classes and sizes are in
``scripts/probe_sandbox.py``; each probe says whether its attack was contained."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstitch.grading.code import grade_code
from rstitch.grading.sandbox import SandboxLimits, run_python

MIB = 1024**2


@dataclass(frozen=True)
class ProbeOutcome:
    """One attack: its class, what it tried, what happened and whether that was contained."""

    attack_class: str
    attack: str
    outcome: str
    contained: bool


def probe_limits(**changes: Any) -> SandboxLimits:
    return SandboxLimits(**{"timeout_s": 3.0, "cpu_s": 3, "memory_bytes": 256 * MIB, "max_output_bytes": 64 * 1024,
                            "max_processes": 16, "disk_bytes": 2 * MIB, **changes})


def run_bounded(call: Callable[[], Any], outer_s: float) -> tuple[Any, float] | None:
    """``call()`` in a daemon thread; None when it has not returned within ``outer_s``."""
    box: list[Any] = []
    start = time.monotonic()
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(outer_s)
    return (box[0], time.monotonic() - start) if box else None


def probe_output_links(outer_s: float) -> list[ProbeOutcome]:
    """Class 1: the program replaces its output files by links or FIFOs before exiting."""
    secret = f"probe-secret-{os.getpid()}"
    os.environ["RSTITCH_PROBE_SECRET"] = secret
    # This process's initial environment (what /proc/self/environ shows the caller): entries long
    # enough to be recognised that the sandbox's own fixed environment does not have.
    environ = Path("/proc/self/environ").read_bytes().decode(errors="replace").split("\0")
    own = [entry for entry in environ if len(entry) >= 12 and not entry.startswith(("PATH=", "LANG=", "HOME=", "PYTHON"))]
    outcomes = []
    with tempfile.TemporaryDirectory() as private_dir:
        private = Path(private_dir) / "root-only.txt"
        private.write_text(secret + "\n")
        private.chmod(0o600)
        for target, what in (("/proc/self/environ", "the caller's environment"), (str(private), "a 0600 file")):
            source = _replace_outputs(f"os.symlink({target!r}, name)") + "raise SystemExit(1)\n"
            done = run_bounded(functools.partial(run_python, source, limits=probe_limits()), outer_s)
            returned = done[0].stdout + done[0].stderr + done[0].report if done is not None else ""
            leaked = any(text in returned for text in (secret, *own))
            outcomes.append(ProbeOutcome("1 outputs", f"stdout/stderr -> link to {what}",
                                         "LEAKED into the result" if leaked else "not leaked", not leaked))
    del os.environ["RSTITCH_PROBE_SECRET"]
    done = run_bounded(lambda: run_python(_replace_outputs("os.mkfifo(name)"), limits=probe_limits()), outer_s)
    outcome = f"returned in {done[1]:.1f} s" if done else f"STALLED the caller (abandoned after {outer_s:.0f} s)"
    outcomes.append(ProbeOutcome("1 outputs", "stdout/stderr -> FIFO", outcome, done is not None))
    return outcomes


def _replace_outputs(make: str) -> str:
    return ("import os\nfor name in ('stdout.txt', 'stderr.txt'):\n"
            "    try:\n        os.remove(name)\n    except OSError:\n        pass\n"
            f"    {make}\n")


HUMANEVAL_TESTS: dict[str, Any] = {"kind": "script", "prefix": "def add_all(numbers):\n",
                   "suffix": "def check(candidate):\n    assert all([candidate([1, 2]) == 3])\n    assert candidate([]) == 0\n\ncheck(add_all)\n"}
LEETCODE_TESTS: dict[str, Any] = {"kind": "functional", "func_name": "plus",
                  "cases": [{"input": "[1, 2]\n3", "output": "5"}, {"input": "[]\n1", "output": "1"}]}
ALWAYS_EQUAL = "class Same:\n    def __eq__(self, other):\n        return True\n"
FAKE_PASSES = (
    ("script", "raise SystemExit(0) inside the function", "    raise SystemExit(0)"),
    ("script", "atexit os._exit(0), wrong body", "    return 0\nimport atexit, os\natexit.register(os._exit, 0)"),
    ("script", "always-equal result", f"    return Same()\n{ALWAYS_EQUAL}"),
    ("script", "builtins.all patched", "    return 0\nimport builtins\nbuiltins.all = lambda x: True"),
    ("functional", "sys.exit made a no-op, wrong body",
     "import sys\nsys.exit = lambda *a: None\nclass Solution:\n    def plus(self, nums, k):\n        return 0"),
    ("functional", "expected value read from the harness", "import json, sys\nclass Solution:\n    def plus(self, nums, k):\n"
     "        return json.loads(sys._getframe(1).f_globals['_expected'])"),
    ("functional", "always-equal result", f"{ALWAYS_EQUAL}class Solution:\n    def plus(self, nums, k):\n        return Same()"),
)


def probe_fake_passes(outer_s: float) -> list[ProbeOutcome]:
    """Class 2: wrong solutions that try to be graded right; the right ones must stay right."""
    tests: dict[str, dict[str, Any]] = {"script": HUMANEVAL_TESTS, "functional": LEETCODE_TESTS}
    right = {"script": "    return sum(numbers)", "functional": "class Solution:\n    def plus(self, nums, k):\n        return len(nums) + k"}
    outcomes = []
    for kind, program in right.items():
        graded = _graded(program, tests[kind], outer_s)
        outcomes.append(ProbeOutcome("2 fake pass", f"{kind}: a right solution", f"graded {graded}", graded == "right"))
    for kind, attack, program in FAKE_PASSES:
        graded = _graded(program, tests[kind], outer_s)
        outcome = "graded right (FAKE PASS)" if graded == "right" else f"graded {graded}"
        outcomes.append(ProbeOutcome("2 fake pass", f"{kind}: {attack}", outcome, graded != "right"))
    return outcomes


def _graded(program: str, tests: dict[str, Any], outer_s: float) -> str:
    done = run_bounded(lambda: grade_code(f"```python\n{program}\n```", tests, probe_limits()), outer_s)
    return "(no answer in time)" if done is None else "right" if done[0]["correct"] else "wrong"


def memory_hog(mib: int) -> str:
    """A program whose 4 children each hold `mib` MiB at once, then print how many held it.

    A child reports once when its memory is written and once more after every child has
    reported: a child the OOM killer ended in between leaves its first byte in the pipe but never
    sends the second, so only children alive with their memory at the same moment are counted."""
    return f"""
import os
children = []
for _ in range(4):
    ready_read, ready_write = os.pipe()
    go_read, go_write = os.pipe()
    if os.fork() == 0:
        block = b'x' * ({mib} * 1024**2)
        os.write(ready_write, b'1')
        os.read(go_read, 1)  # hold the memory until every child has reported
        os.write(ready_write, b'2')
        os._exit(0)
    os.close(ready_write)
    children.append((ready_read, go_write))
for ready, _ in children:
    os.read(ready, 1)
for _, go in children:
    try:
        os.write(go, b'1')
    except BrokenPipeError:
        pass
print(sum(os.read(ready, 1) == b'2' for ready, _ in children))
"""


FORKS = """
import os, time
count = 1
try:
    for _ in range(40):
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        count += 1
except OSError:
    pass
print(count)
"""
DISK_FILL = """
written = 0
try:
    for i in range(160):
        with open(f'f{i}', 'wb') as handle:
            handle.write(b'x' * 65536)
        written += 1
except OSError:
    pass
print(written * 65536)
"""


def probe_whole_sample_limits(outer_s: float) -> list[ProbeOutcome]:
    """Class 3: memory, processes and disk summed over the sample."""
    attacks = ((memory_hog(64), probe_limits(memory_bytes=128 * MIB), "4 processes x 64 MiB under a 128 MiB limit", 3, "{} of 4 held their memory"),
               (FORKS, probe_limits(max_processes=8), "40 forks under an 8-process limit", 8, "{} processes ran"),
               (DISK_FILL, probe_limits(), "160 files x 64 KiB under a 2 MiB disk limit", 2 * MIB, "{:,} bytes written"))
    outcomes = []
    for source, limits, attack, most, shown in attacks:
        done = run_bounded(functools.partial(run_python, source, limits=limits), outer_s)
        printed = done[0].stdout.split() if done is not None else []  # the program's last act: one count
        count = int(printed[-1]) if printed and printed[-1].isdigit() else None
        outcome = shown.format(count) if count is not None else "did not run to the end"
        outcomes.append(ProbeOutcome("3 whole sample", attack, outcome, count is None or count <= most))
    return outcomes


PROC_SCAN = """
import os
seen = []
for pid in os.listdir('/proc'):
    try:
        seen.append(open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace'))
    except OSError:
        pass
print(len([p for p in os.listdir('/proc') if p.isdigit()]))
print(seen)
"""


def probe_proc(outer_s: float) -> list[ProbeOutcome]:
    """Class 4: host command lines through /proc."""
    token = f"--token=probe-{os.getpid()}"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token])
    try:
        done = run_bounded(lambda: run_python(PROC_SCAN, limits=probe_limits()), outer_s)
    finally:
        holder.kill()
        holder.wait()
    if done is None:
        return [ProbeOutcome("4 /proc", "read every /proc/*/cmdline", "(no answer in time)", True)]
    visible = token in done[0].stdout
    pids = done[0].stdout.splitlines()[0] if done[0].stdout else "?"
    return [ProbeOutcome("4 /proc", "read every /proc/*/cmdline", f"{pids} processes listed; the caller's "
                         f"--token argument {'VISIBLE' if visible else 'not visible'}", not visible)]


HOST_FILES = """
import json, os, sys
read = []
for path in {paths!r}:
    try:
        read.append(open(path).read(200))
    except OSError:
        pass
wrote = []
for directory in {directories!r}:
    try:
        open(os.path.join(directory, {name!r}), 'w').write('left behind')
        wrote.append(directory)
    except OSError:
        pass
print(json.dumps({{'read': read, 'wrote': wrote}}))
"""
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")


def probe_host_files(outer_s: float) -> list[ProbeOutcome]:
    """Class 5: host files read (a world-readable one beside the project, /etc/passwd) or left behind."""
    project = Path(__file__).resolve().parents[2]
    name = f".rstitch-probe-{os.getpid()}"
    canary = project / name
    secret = f"probe canary {os.getpid()}-{time.monotonic_ns()}"
    if not os.access(project, os.W_OK):  # a read-only checkout: a world-readable file in /tmp
        canary = Path(tempfile.gettempdir()) / name
    canary.write_text(secret)
    canary.chmod(0o644)
    source = HOST_FILES.format(paths=[str(canary), "/etc/passwd"], directories=[*WORLD_WRITABLE, str(project)], name=name)
    try:
        done = run_bounded(lambda: run_python(source, limits=probe_limits()), outer_s)
    finally:
        canary.unlink(missing_ok=True)
    left = [d for d in (*WORLD_WRITABLE, str(project)) if Path(d, name).exists()]
    for directory in left:
        Path(directory, name).unlink(missing_ok=True)
    if done is None:
        return [ProbeOutcome("5 host files", "read host files, write outside", "(no answer in time)", not left)]
    seen = secret in done[0].stdout or "root:x:0:0" in done[0].stdout
    isolation = str(done[0].isolation.get("empty_root", "?")).split(":")[0]
    return [ProbeOutcome("5 host files", "read a world-readable file and /etc/passwd", f"{'READ' if seen else 'not read'} ({isolation})", not seen),
            ProbeOutcome("5 host files", "write to /tmp, /var/tmp, /dev/shm, /run/lock, /var/lock, the project",
                         f"{len(left)} files LEFT behind: {', '.join(left)}" if left else "nothing left behind", not left)]


def run_probes(outer_s: float) -> list[ProbeOutcome]:
    probes = (probe_output_links, probe_fake_passes, probe_whole_sample_limits, probe_proc, probe_host_files)
    return [outcome for probe in probes for outcome in probe(outer_s)]


def report(outcomes: list[ProbeOutcome]) -> str:
    width = max(len(o.attack) for o in outcomes)
    lines = [f"{'class':<15} {'attack':<{width}}  outcome"]
    lines += [f"{o.attack_class:<15} {o.attack:<{width}}  {'ok  ' if o.contained else 'OPEN'} {o.outcome}" for o in outcomes]
    open_count = sum(1 for o in outcomes if not o.contained)
    lines.append(f"{len(outcomes) - open_count} of {len(outcomes)} contained; {open_count} open")
    return "\n".join(lines)
