"""Supervisor of one sandboxed program (``python -I _sandbox_supervisor.py``, config JSON on stdin;
docs/sandbox.md): standard library only, so that it runs isolated (``-I``). Output comes through
capped pipes, never a path the program could have replaced; the verdict is one JSON line on stdout."""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
SHARED_TMP = ("/var/tmp", "/dev/shm")  # world-writable elsewhere; here the same sized tmpfs as /tmp
REPORT_FD = 3
STARTED_FD, SOURCE_FD, SECCOMP_FD = 4, 5, 6  # the empty root's descriptors (sandbox_root.py)
HIGH_FD = 16  # descriptors are moved above this before they are placed at 0-6
SIGNAL_EXIT = 128  # bwrap exits 128 + n when the program died of signal n
PROC_STATES = {b"F": "fresh", b"H": "hidden (empty tmpfs)"}
DRAIN_S = 0.2  # after the program ends: how long leftover output may still arrive
REAP_S = 1.0  # after it: how long its orphans (bwrap's PID 1) may take to end

_libc = ctypes.CDLL(None, use_errno=True)


def main() -> None:
    config = json.loads(sys.stdin.buffer.read())
    # Orphans of the sample (bwrap's PID 1 outlives bwrap by a moment) become this process's to
    # reap: left to a container's init that does not reap, their zombies would count against
    # the sandbox user's process limit.
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    isolation: dict[str, object] = {"cgroup": _join_cgroup(config["cgroup_procs"])}
    if not isolation["cgroup"]:  # per-process limits only: fewer processes, so their sum fits the machine
        config["max_processes"] = config["fallback_max_processes"]
    isolation.update(user=f"uid {os.getuid()} (not dropped)", interpreter=config["argv"][0])
    if os.getuid() == 0 and config["uid"] is not None:  # nobody: process limits then count, files and signals are denied
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
        isolation["user"] = f"uid {config['uid']}"
    isolation.update(empty_root=config["empty_root_note"], seccomp=config["seccomp_note"])
    if config["empty_root"] and "--unshare-user" in config["empty_root"]:
        isolation["user"] = "uid 65534 in a user namespace of its own (the caller's root outside, no capabilities)"
    extra: dict[int, int] = {}
    if config["empty_root"]:
        isolation.update(pid_namespace=True, no_network=True, private_tmp=True, disk_limit=True)
        extra[SOURCE_FD] = _memory_file("main.py", config["source"].encode())
        if config["seccomp_bpf"]:
            extra[SECCOMP_FD] = _memory_file("seccomp", bytes.fromhex(config["seccomp_bpf"]))
    else:
        isolation.update(_enter_namespaces(config))
        # created afresh: O_EXCL, never through a link the program could have left
        with open(os.path.join(config["workdir"], "main.py"), "xb", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW, 0o600)) as handle:
            handle.write(config["source"].encode())
        os.chdir(config["workdir"])
    stdin = _memory_file("stdin", config["stdin"].encode()) if config["stdin"] is not None else os.open(os.devnull, os.O_RDONLY)
    pipes = {name: os.pipe() for name in ("stdout", "stderr", "report", "setup")}
    child = os.fork()
    if child == 0:
        _exec_program(config, stdin, {name: write for name, (_, write) in pipes.items()}, isolation, extra)
    for fd in (stdin, *extra.values(), *(write for _, write in pipes.values())):
        os.close(fd)
    verdict = _supervise(child, {name: read for name, (read, _) in pipes.items()}, config)
    until = time.monotonic() + REAP_S  # every process left to this one ends once bwrap has
    with contextlib.suppress(ChildProcessError):  # raised once none is left
        while time.monotonic() < until:
            if not os.waitpid(-1, os.WNOHANG)[0]:
                time.sleep(0.005)
    setup = verdict.pop("setup")  # before exec (no bubblewrap), or the program's first act inside it
    isolation["private_proc"] = PROC_STATES.get(setup[:1].encode(), False)
    if config["empty_root"]:
        if not setup:
            reason = (verdict["stderr"].strip().splitlines() or ["bwrap gave no reason"])[-1]
            verdict = {"sandbox_error": f"the empty root did not start: {reason[:300]}"}
        elif verdict["exit_code"] is not None and verdict["exit_code"] > SIGNAL_EXIT:
            verdict.update(signal=verdict["exit_code"] - SIGNAL_EXIT, exit_code=None)
    print(json.dumps({**verdict, "isolation": isolation}), flush=True)


def _join_cgroup(procs_files: list[str]) -> bool:
    """While still root, move this process into the sample's cgroup(s): the program inherits them."""
    try:
        for path in procs_files:
            with open(path, "wb") as handle:
                handle.write(str(os.getpid()).encode())
    except OSError:
        return False
    return bool(procs_files)


def _enter_namespaces(config: dict) -> dict:
    """New user+PID+network(+mount) namespaces; each part is best effort and reported."""
    flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
    uid, gid = os.getuid(), os.getgid()
    _libc.prctl(PR_SET_DUMPABLE, 1)  # /proc/self/*_map are writable only by a dumpable process
    mount_namespace = _libc.unshare(flags | CLONE_NEWNS) == 0
    isolated = mount_namespace or _libc.unshare(flags) == 0
    if isolated:  # our own ids mapped in, so files on its tmpfs get an owner (unmapped, creating one fails)
        with contextlib.suppress(OSError):
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "wb") as handle:  # bytes: no codec import as the new user
                    handle.write(text.encode())
    private, sized = _private_tmp(config["workdir"], config["disk_bytes"]) if mount_namespace else (False, False)
    _libc.prctl(PR_SET_DUMPABLE, 0)  # nothing of this user may ptrace the supervisor
    return {"pid_namespace": isolated, "no_network": isolated, "private_tmp": private, "disk_limit": sized}


def _private_tmp(workdir: str, disk_bytes: int) -> tuple[bool, bool]:
    """One tmpfs of ``disk_bytes`` on /tmp (the working directory), /var/tmp and /dev/shm: all writes
    count against one size. Returns (all three private, the working directory size-limited)."""
    if os.path.dirname(workdir) != "/tmp" or _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False, False
    options = f"size={int(disk_bytes)},mode=0700".encode()
    if _libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        return False, False
    os.mkdir(workdir, 0o700)
    bound = all(_libc.mount(b"/tmp", path.encode(), None, MS_BIND, None) == 0
                for path in SHARED_TMP if os.path.isdir(path))
    return bound, True


def _memory_file(name: str, data: bytes) -> int:
    """``data`` as an anonymous in-memory file read from its start (no path anywhere)."""
    fd = os.memfd_create(name)
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _exec_program(config: dict, stdin: int, writers: dict[str, int], isolation: dict, extra: dict[int, int]) -> None:
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor dies -> so does the program
        os.setpgid(0, 0)  # without a PID namespace, the group is what the supervisor can kill
        targets = {0: stdin, 1: writers["stdout"], 2: writers["stderr"], REPORT_FD: writers["report"], **extra}
        argv = config["argv"]
        if config["empty_root"]:
            targets[STARTED_FD] = writers["setup"]  # written by the program once inside (RUN_MAIN_IN_ROOT)
            argv = config["empty_root"] + argv
        else:
            os.write(writers["setup"], _private_proc(isolation))  # closed at exec
        moved = {target: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD) for target, fd in targets.items()}
        for target, fd in moved.items():  # from above HIGH_FD: no source is overwritten by a target
            os.dup2(fd, target)
        cpu = int(config["cpu_s"])
        for kind, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (config["memory_bytes"],) * 2),
                            (resource.RLIMIT_FSIZE, (config["disk_bytes"],) * 2), (resource.RLIMIT_NOFILE, (64, 64)),
                            (resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_NPROC, (config["max_processes"],) * 2)):
            resource.setrlimit(kind, value)
        os.execve(argv[0], argv, config["env"])
    except BaseException as err:  # noqa: BLE001 - report and leave; never return into the supervisor
        os.write(2, f"sandbox: cannot start the program: {err}\n".encode())
    os._exit(127)


def _private_proc(isolation: dict) -> bytes:
    """As PID 1 of the new namespace, mount a fresh /proc: it lists only the sample's processes.
    Where that is refused, an empty tmpfs hides the host's /proc instead. Says which (PROC_STATES)."""
    if not (isolation["pid_namespace"] and isolation["disk_limit"]):  # i.e. a mount namespace of our own
        return b"-"
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if _libc.mount(b"proc", b"/proc", b"proc", flags, None) == 0:
        return b"F"
    return b"H" if _libc.mount(b"tmpfs", b"/proc", b"tmpfs", flags, b"size=4k,mode=0555") == 0 else b"-"


def _supervise(child: int, readers: dict[str, int], config: dict) -> dict:
    """Read the program's pipes (each capped) until it exits, its time is up or it floods a pipe."""
    cap, deadline = int(config["max_output_bytes"]), time.monotonic() + config["timeout_s"]
    captured = {name: bytearray() for name in readers}
    open_fds = {fd: name for name, fd in readers.items()}
    for fd in open_fds:
        os.set_blocking(fd, False)
    timed_out = flooded = False
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0 or flooded:
            timed_out = not flooded
            with contextlib.suppress(OSError):  # PID 1 of its namespace: takes every descendant with it
                os.killpg(child, signal.SIGKILL)
            _, status = os.waitpid(child, 0)
            break
        flooded = _read_ready(open_fds, captured, cap, min(remaining, 0.05))
    with contextlib.suppress(OSError):  # leftovers of a program that exited (gone already in a PID namespace)
        os.killpg(child, signal.SIGKILL)
    until = time.monotonic() + DRAIN_S  # bounded in time even if a leftover holds a pipe
    while open_fds and time.monotonic() < until and not _over(captured, cap):
        _read_ready(open_fds, captured, cap, 0.01)
    for fd in open_fds:
        os.close(fd)
    captured["setup"] = captured["setup"][:1]  # one byte, whatever was written after it; not an output
    code = os.waitstatus_to_exitcode(status)  # -n: killed by signal n
    return {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None, "timed_out": timed_out,
            "output_limit": flooded or _over(captured, cap),
            **{name: bytes(data[:cap]).decode("utf-8", errors="replace") for name, data in captured.items()}}


def _read_ready(open_fds: dict[int, str], captured: dict[str, bytearray], cap: int, wait_s: float) -> bool:
    """One select round (with no stream left, a sleep); True once a stream went past its cap (the program is then stopped)."""
    ready, _, _ = select.select(list(open_fds), [], [], wait_s)
    for fd in ready:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            os.close(fd)
            del open_fds[fd]
            continue
        captured[open_fds[fd]] += chunk[: cap + 1 - len(captured[open_fds[fd]])]
    return _over(captured, cap)


def _over(captured: dict[str, bytearray], cap: int) -> bool:
    return any(len(data) > cap for data in captured.values())


if __name__ == "__main__":
    main()
