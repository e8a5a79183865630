"""Run model-written Python in a separate, limited process: what it sees and what it is kept from
are in docs/sandbox.md. Whatever the program does, the caller gets a ``SandboxResult`` within the
timeout plus a fixed grace; a sandbox that cannot start is a failed sample, not an exception."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rstitch.errors import ConfigError
from rstitch.grading.sandbox_cgroup import SampleCgroup, sample_cgroup
from rstitch.grading.sandbox_root import (
    BWRAP_PROCESSES,
    INSIDE_WORKDIR,
    MISSING,
    NOBODY_UID,
    STARTED_FD,
    bubblewrap,
    bubblewrap_version,
    bwrap_argv,
    interpreter_prefix,
    seccomp_program,
)

SUPERVISOR = Path(__file__).with_name("_sandbox_supervisor.py")
# The program reads its source by a relative path and runs it as __main__ (runpy would resolve
# 'main.py' to an absolute path first).
RUN_MAIN = ("import sys; sys.argv = ['main.py']; source = open('main.py', encoding='utf-8').read(); "
            "exec(compile(source, 'main.py', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})")
# On the empty root: first say the interpreter is up (STARTED_FD; without that byte bwrap never
# started it, and its error is the sample's), then close every descriptor but 0-3.
RUN_MAIN_IN_ROOT = f"import os; os.write({STARTED_FD}, b'F'); os.closerange({STARTED_FD}, 64); del os; " + RUN_MAIN
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
SUPERVISOR_GRACE_S = 5.0  # the supervisor enforces the timeout; this only guards the supervisor itself
WORK_PARENT = "/tmp"  # the supervisor mounts the sample's own sized tmpfs here
MACHINE_SHARE = 0.5  # without a cgroup: processes x per-process memory stays under this share of RAM
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one program; what each covers (whole sample or per process) is in docs/sandbox.md."""

    timeout_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 2 * 1024**3
    max_output_bytes: int = 1024**2
    max_processes: int = 32
    disk_bytes: int = 64 * 1024**2

    def __post_init__(self) -> None:
        for limit in fields(self):
            value = getattr(self, limit.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"sandbox {limit.name} must be a number > 0, got {value!r}")


@dataclass(frozen=True)
class SandboxResult:
    """What one program did. ``status``: ok (exit 0), error (other exit code), timeout, output_limit,
    killed (by a signal: a limit or its own kill) or sandbox_error. ``report``: what it wrote to fd 3, a pipe."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    isolation: dict[str, Any] = field(default_factory=dict)
    report: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(source: str, stdin: str | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``source`` as a Python script in the sandbox and return its outcome."""
    limits = limits or SandboxLimits()
    start = time.monotonic()
    workdir: Path | None = None
    cgroup: SampleCgroup | None = None
    try:
        python, uid = sandbox_python()
        empty_root = bubblewrap() is not None
        if not empty_root:  # the supervisor mounts the sample's tmpfs over this, where it can
            workdir = Path(tempfile.mkdtemp(prefix="rstitch-sandbox-", dir=WORK_PARENT))
            if uid is not None:  # the mount point, and the working directory where no tmpfs can be mounted
                os.chown(workdir, uid, uid)
        overhead = BWRAP_PROCESSES if empty_root else 0
        cgroup = sample_cgroup(int(limits.memory_bytes), int(limits.max_processes) + overhead)
        verdict = _supervise(_config(workdir, python, uid, source, stdin, limits, cgroup), limits)
        isolation = verdict.setdefault("isolation", {})
        gib = int(limits.memory_bytes) / 1024**3
        isolation["whole_sample"] = (
            f"cgroup v{cgroup.version}: {gib:.3g} GiB and {int(limits.max_processes)} processes for the whole sample"
            if cgroup is not None and isolation.get("cgroup") else
            f"no cgroup: {gib:.3g} GiB per process, at most {fitting_process_count(limits)} processes (their product fits the machine)")
    except OSError as err:  # e.g. no space for the mount point
        verdict = {"sandbox_error": str(err)}
    finally:
        duration = time.monotonic() - start
        if cgroup is not None:
            cgroup.remove()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)  # fd-based: a link left in it is removed, not followed
    if "sandbox_error" in verdict:
        return SandboxResult("sandbox_error", None, "", f"sandbox: {verdict['sandbox_error']}", duration)
    status = ("timeout" if verdict["timed_out"] else "output_limit" if verdict["output_limit"]
              else "killed" if verdict["signal"] is not None else "ok" if verdict["exit_code"] == 0 else "error")
    return SandboxResult(status, verdict["exit_code"], verdict["stdout"], verdict["stderr"], duration,
                         verdict.get("isolation", {}), verdict["report"])


def sandbox_python() -> tuple[str, int | None]:
    """(interpreter, uid): the base interpreter of a virtualenv; root drops to ``nobody`` where nobody
    can run it or the system Python (a virtualenv under a private home it cannot), else keeps its uid."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    if os.getuid() == 0:
        for candidate in (base, *SYSTEM_PYTHONS):
            if _runnable_by_others(candidate):
                return candidate, NOBODY_UID
    return base, None


def _runnable_by_others(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return real.is_file() and all(entry.stat().st_mode & stat.S_IXOTH for entry in (real, *real.parents))


def _config(workdir: Path | None, python: str, uid: int | None, source: str, stdin: str | None,
            limits: SandboxLimits, cgroup: SampleCgroup | None) -> dict[str, Any]:
    """The supervisor's instructions. ``workdir`` None: the empty root; else the host path the supervisor uses."""
    inside = INSIDE_WORKDIR if workdir is None else str(workdir)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": inside,
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8"}
    seccomp, seccomp_note = seccomp_program() if workdir is None else (None, "not applied: no bubblewrap")
    root: list[str] | None = None
    overhead = BWRAP_PROCESSES if workdir is None else 0
    if workdir is None:
        python = os.path.realpath(python)  # inside the root only the installation it belongs to exists
        root = bwrap_argv(python, int(limits.disk_bytes), os.getuid() == 0 and uid is None, seccomp is not None)
    return {
        "workdir": inside,
        "uid": uid,
        "argv": [python, "-I", "-c", RUN_MAIN if root is None else RUN_MAIN_IN_ROOT],
        "empty_root": root,
        "empty_root_note": (f"{bubblewrap_version()}: only {interpreter_prefix(python)} and the system libraries, "
                            "read-only") if root is not None else f"none: {MISSING}",
        "seccomp_bpf": seccomp.hex() if seccomp else None,
        "seccomp_note": seccomp_note,
        "env": env,
        "source": source,
        "stdin": stdin,
        "cgroup_procs": cgroup.procs_files if cgroup else [],
        "timeout_s": limits.timeout_s,
        "cpu_s": max(1, int(limits.cpu_s + 0.999)),
        "memory_bytes": int(limits.memory_bytes),
        "max_output_bytes": int(limits.max_output_bytes),
        "disk_bytes": int(limits.disk_bytes),
        "max_processes": _process_limit(uid, int(limits.max_processes) + overhead),
        "fallback_max_processes": _process_limit(uid, fitting_process_count(limits) + overhead),
    }


def fitting_process_count(limits: SandboxLimits) -> int:
    """Without a cgroup: processes x ``memory_bytes`` stays under ``MACHINE_SHARE`` of the machine's memory."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(int(limits.max_processes), int(machine * MACHINE_SHARE) // int(limits.memory_bytes)))


def _process_limit(uid: int | None, wanted: int) -> int:
    """RLIMIT_NPROC counts every process of the user: as the caller's own, its current ones are added."""
    if uid is not None:
        return int(wanted)
    mine = 0
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            mine += entry.name.isdigit() and entry.stat().st_uid == os.getuid()
    return mine + int(wanted)


def _supervise(config: dict[str, Any], limits: SandboxLimits) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-I", str(SUPERVISOR)], input=json.dumps(config).encode(),
            capture_output=True, env={"PATH": "/usr/bin:/bin"},
            timeout=limits.timeout_s + SUPERVISOR_GRACE_S, start_new_session=True, check=False,
        )
    except subprocess.TimeoutExpired:
        return {"sandbox_error": "the supervisor did not return"}
    try:
        verdict = json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        verdict = None
    if not isinstance(verdict, dict):
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no verdict"]
        return {"sandbox_error": reason[0][:300]}
    return verdict


def check_code_sandbox(allow_weak: bool = False) -> dict[str, Any]:
    """Before a code benchmark decodes: run one program and return its ``isolation``. A sandbox that
    cannot, or has no empty root without ``allow_weak`` (``weak_code_sandbox=true``), is a ``ConfigError``."""
    result = run_python("print('ok')", limits=SandboxLimits(timeout_s=30.0, cpu_s=10))
    if not (result.ok and result.stdout == "ok\n"):
        reason = (result.stderr.strip().splitlines() or [result.status])[-1]
        raise ConfigError(f"the code sandbox cannot run a program here ({reason[:300]}); docs/sandbox.md lists what it needs")
    if str(result.isolation.get("empty_root", "")).startswith("none"):
        if not allow_weak:
            raise ConfigError(f"code benchmarks run model-written programs, and {MISSING}; "
                              "or accept programs that can read the host's files with weak_code_sandbox=true")
        log.warning("sandbox: weak_code_sandbox=true: %s", MISSING)
    return result.isolation
