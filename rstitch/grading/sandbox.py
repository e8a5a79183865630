"""Run model-written Python in a separate, limited process (docs/datasets.md, "Code execution").

Each call gets a fresh temporary working directory (deleted afterwards), an environment of a few
fixed variables (nothing inherited), stdin from the given text or closed, a wall-clock timeout,
CPU-time, memory, file-size, open-file and process-count limits, and on Linux new user, PID,
network and mount namespaces where the kernel allows. Whatever the program does, the caller gets a
``SandboxResult``; a sandbox that cannot start is a failed sample, not an exception.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPERVISOR = Path(__file__).with_name("_sandbox_supervisor.py")
NOBODY_UID = 65534
# The working directory sits under /tmp, which the supervisor hides behind a private tmpfs: the
# program reaches it through its current directory only (runpy would turn 'main.py' into the
# hidden absolute path), so it is read by a relative path and run as __main__.
RUN_MAIN = ("import sys; sys.argv = ['main.py']; source = open('main.py', encoding='utf-8').read(); "
            "exec(compile(source, 'main.py', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
SUPERVISOR_GRACE_S = 5.0  # the supervisor enforces the timeout; this only guards the supervisor itself


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. ``max_processes`` is RLIMIT_NPROC of the sandbox user (root drops to
    ``nobody``; otherwise the limit counts the caller's own processes too, so it is added to them)."""

    timeout_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 2 * 1024**3
    max_output_bytes: int = 1024**2
    max_processes: int = 32

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_bytes", "max_output_bytes", "max_processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"sandbox {name} must be a number > 0, got {value!r}")


@dataclass(frozen=True)
class SandboxResult:
    """What one program did. ``status``: ok (exit 0), error (other exit code), timeout, killed
    (by a signal: CPU or file-size limit, its own kill) or sandbox_error (could not run it)."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    isolation: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(source: str, stdin: str | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``source`` as a Python script in the sandbox and return its outcome."""
    limits = limits or SandboxLimits()
    workdir = Path(tempfile.mkdtemp(prefix="rstitch-sandbox-"))
    start = time.monotonic()
    try:
        python, uid = sandbox_python()
        _prepare(workdir, source, stdin, uid)
        config = _config(workdir, python, uid, stdin is not None, limits)
        verdict = _supervise(config, limits)
        return _result(verdict, workdir, limits, time.monotonic() - start)
    except OSError as err:  # e.g. no space for the working directory
        return SandboxResult("sandbox_error", None, "", f"sandbox: {err}", time.monotonic() - start)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def sandbox_python() -> tuple[str, int | None]:
    """(interpreter, uid) for the program. Root drops to ``nobody``, who must be able to run the
    interpreter: this one if every directory above it is open to others, else the system Python
    (a virtualenv under a private home is not); with neither, the program keeps the caller's uid."""
    if os.getuid() != 0:
        return sys.executable, None
    for candidate in (sys.executable, *SYSTEM_PYTHONS):
        if _runnable_by_others(candidate):
            return candidate, NOBODY_UID
    return sys.executable, None


def _runnable_by_others(path: str) -> bool:
    real = Path(os.path.realpath(path))
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in real.parents)


def _prepare(workdir: Path, source: str, stdin: str | None, uid: int | None) -> None:
    (workdir / "main.py").write_text(source, encoding="utf-8")
    if stdin is not None:
        (workdir / "stdin.txt").write_text(stdin, encoding="utf-8")
    if uid is None:
        return
    for path in (workdir, *workdir.iterdir()):  # the program runs as nobody and owns only this
        os.chown(path, uid, uid)


def _config(workdir: Path, python: str, uid: int | None, has_stdin: bool, limits: SandboxLimits) -> dict[str, Any]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8"}
    return {
        "workdir": str(workdir),
        "uid": uid,
        "argv": [python, "-I", "-c", RUN_MAIN],
        "env": env,
        "stdin": "stdin.txt" if has_stdin else None,
        "timeout_s": limits.timeout_s,
        "cpu_s": max(1, int(limits.cpu_s + 0.999)),
        "memory_bytes": int(limits.memory_bytes),
        "max_file_bytes": int(limits.max_output_bytes),
        "max_processes": _process_limit(uid, limits.max_processes),
    }


def _process_limit(uid: int | None, wanted: int) -> int:
    """RLIMIT_NPROC counts every process of the user: as nobody that is the sandboxes alone;
    as the caller's own user, its current processes are added so the program can start."""
    if uid is not None:
        return int(wanted)
    mine = sum(1 for entry in Path("/proc").iterdir() if entry.name.isdigit() and _owned_by_me(entry))
    return mine + int(wanted)


def _owned_by_me(entry: Path) -> bool:
    try:
        return entry.stat().st_uid == os.getuid()
    except OSError:
        return False


def _supervise(config: dict[str, Any], limits: SandboxLimits) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-I", str(SUPERVISOR), json.dumps(config)],
            stdin=subprocess.DEVNULL, capture_output=True, env={"PATH": "/usr/bin:/bin"},
            timeout=limits.timeout_s + SUPERVISOR_GRACE_S, start_new_session=True, check=False,
        )
    except subprocess.TimeoutExpired:
        return {"sandbox_error": "the supervisor did not return"}
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no verdict"]
        return {"sandbox_error": reason[0][:300]}


def _result(verdict: dict[str, Any], workdir: Path, limits: SandboxLimits, duration: float) -> SandboxResult:
    stdout = _read_capped(workdir / "stdout.txt", limits.max_output_bytes)
    stderr = _read_capped(workdir / "stderr.txt", limits.max_output_bytes)
    if "sandbox_error" in verdict:
        return SandboxResult("sandbox_error", None, stdout, f"sandbox: {verdict['sandbox_error']}", duration)
    return SandboxResult(_status(verdict), verdict["exit_code"], stdout, stderr, duration, verdict.get("isolation", {}))


def _status(verdict: dict[str, Any]) -> str:
    if verdict["timed_out"]:
        return "timeout"
    if verdict["signal"] is not None:
        return "killed"
    return "ok" if verdict["exit_code"] == 0 else "error"


def _read_capped(path: Path, limit: int) -> str:
    try:
        with path.open("rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""
