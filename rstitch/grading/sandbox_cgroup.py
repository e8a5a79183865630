"""A cgroup per sandboxed sample (root only): memory and process count for the sample as a whole.
cgroup v2 under a ``rstitch-sandbox`` parent of the root (whose controllers can always be enabled),
else v1 memory + pids (a child of this process's own cgroup in each); else None: per-process limits."""
from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V2_PARENT = "rstitch-sandbox"
REMOVE_WAIT_S = 2.0


@dataclass(frozen=True)
class SampleCgroup:
    """The sample's cgroup directories (one for v2, memory and pids for v1)."""

    version: int
    dirs: tuple[Path, ...]

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def remove(self) -> None:
        """Kill whatever is left in it and remove it; bounded in time."""
        for directory in self.dirs:
            _write_quietly(directory / "cgroup.kill", "1")
        deadline = time.monotonic() + REMOVE_WAIT_S
        pending = [d for d in self.dirs if d.exists()]
        while pending and time.monotonic() < deadline:
            for directory in pending:
                with contextlib.suppress(OSError):
                    for pid in (directory / "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError, ValueError):
                            os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):  # busy until its last process is gone
                    directory.rmdir()
            pending = [d for d in pending if d.exists()]
            if pending:
                time.sleep(0.02)


def sample_cgroup(memory_bytes: int, max_processes: int) -> SampleCgroup | None:
    """A fresh cgroup of ``memory_bytes`` and ``max_processes`` (+1: the supervisor joins it), or None."""
    if os.getuid() != 0:
        return None
    for make in (_make_v2, _make_v1):
        made: list[Path] = []  # the directories made so far, removed again when a later step fails
        try:
            version = make(memory_bytes, max_processes + 1, made)
        except OSError:
            SampleCgroup(0, tuple(made)).remove()
            continue
        if version is not None:
            return SampleCgroup(version, tuple(made))
    return None


def _make_v2(memory_bytes: int, pids: int, made: list[Path]) -> int | None:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if not controllers.exists() or not {"memory", "pids"} <= set(controllers.read_text().split()):
        return None
    parent = CGROUP_ROOT / V2_PARENT
    (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids")
    parent.mkdir(exist_ok=True)
    (parent / "cgroup.subtree_control").write_text("+memory +pids")
    directory = parent / uuid.uuid4().hex
    directory.mkdir()
    made.append(directory)
    (directory / "memory.max").write_text(str(memory_bytes))
    _write_quietly(directory / "memory.swap.max", "0")
    (directory / "pids.max").write_text(str(pids))
    return 2


def _make_v1(memory_bytes: int, pids: int, made: list[Path]) -> int | None:
    own = _own_v1_paths()
    memory_root, pids_root = CGROUP_ROOT / "memory", CGROUP_ROOT / "pids"
    if "memory" not in own or "pids" not in own or not (memory_root / "memory.limit_in_bytes").exists():
        return None
    name = f"rstitch-sandbox-{uuid.uuid4().hex}"
    memory_dir = memory_root / own["memory"].lstrip("/") / name
    pids_dir = pids_root / own["pids"].lstrip("/") / name
    for directory in (memory_dir, pids_dir):
        directory.mkdir()
        made.append(directory)
    (memory_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
    _write_quietly(memory_dir / "memory.memsw.limit_in_bytes", str(memory_bytes))  # no swap beyond it
    (pids_dir / "pids.max").write_text(str(pids))
    return 1


def _own_v1_paths() -> dict[str, str]:
    """controller -> this process's cgroup path, from /proc/self/cgroup's v1 lines."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    return {controller: path for _, controllers, path in (line.split(":", 2) for line in lines)
            for controller in controllers.split(",") if controller}


def _write_quietly(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(text)
