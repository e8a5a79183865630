"""The sandbox against hostile programs: each one fails its sample, and the caller, the machine and
the files outside the working directory are untouched. Short limits keep the suite fast."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rstitch.grading.sandbox import SandboxLimits, run_python

FAST = SandboxLimits(timeout_s=2.0, cpu_s=2, memory_bytes=512 * 1024**2, max_output_bytes=64 * 1024, max_processes=16)


def run(source: str, **kwargs):
    return run_python(source, limits=FAST, **kwargs)


def test_a_well_behaved_program_runs_with_stdin_and_output():
    result = run("print(int(input()) * 2)", stdin="21\n")
    assert result.ok and result.exit_code == 0 and result.stdout == "42\n"
    assert run("raise SystemExit(3)").status == "error"


def test_stdin_is_closed_when_no_input_is_given():
    result = run("import sys; print(repr(sys.stdin.read()))")
    assert result.ok and result.stdout == "''\n"


def test_infinite_loop_is_stopped_by_the_timeout():
    start = time.monotonic()
    result = run("while True:\n    pass")
    assert result.status in ("timeout", "killed") and not result.ok
    assert time.monotonic() - start < FAST.timeout_s + 3


def test_fork_loop_is_contained_and_leaves_no_process():
    source = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run(source)
    assert not result.ok
    time.sleep(0.2)
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith("/") and "os.fork()" in _cmdline(p)]
    assert leftovers == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_ten_gigabyte_allocation_fails_inside_the_program():
    result = run("data = bytearray(10 * 1024**3)\nprint('allocated')")
    assert not result.ok and "allocated" not in result.stdout
    assert "MemoryError" in result.stderr or result.status == "killed"


def test_writing_outside_the_working_directory_fails_and_inside_works(tmp_path):
    target = tmp_path / "escaped.txt"
    result = run(f"open({str(target)!r}, 'w').write('x')")
    assert not result.ok and not target.exists()
    assert not Path("/tmp/rstitch-escape-test.txt").exists()
    result = run("open('/tmp/rstitch-escape-test.txt', 'w').write('x')")
    assert not Path("/tmp/rstitch-escape-test.txt").exists()
    assert run("open('scratch.txt', 'w').write('x'); print(open('scratch.txt').read())").stdout == "x\n"


def test_the_working_directory_is_fresh_and_deleted():
    first = run("import os; print(sorted(os.listdir('.')))")
    assert first.ok and first.stdout.strip() == "['main.py', 'stderr.txt', 'stdout.txt']"
    leftover = run("open('left.txt', 'w').write('x')")
    assert leftover.ok
    assert "left.txt" not in run("import os; print(os.listdir('.'))").stdout


def test_environment_secrets_are_not_inherited(monkeypatch):
    monkeypatch.setenv("RSTITCH_TEST_SECRET", "hunter2")
    result = run("import os; print(dict(os.environ))")
    assert result.ok and "hunter2" not in result.stdout and "RSTITCH_TEST_SECRET" not in result.stdout


def test_huge_print_is_capped_and_fails_the_sample():
    result = run("while True:\n    print('x' * 1000)")
    assert not result.ok
    assert len(result.stdout) <= FAST.max_output_bytes


def test_killing_the_parent_or_the_caller_does_not_reach_them():
    caller = os.getpid()
    result = run(f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({caller}, signal.SIGKILL)")
    assert not result.ok  # we are still here to check it


def test_no_network():
    result = run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert not result.ok


def test_isolation_report_names_what_applied():
    result = run("pass")
    assert result.ok and {"user", "interpreter", "pid_namespace", "no_network", "private_tmp"} <= set(result.isolation)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
