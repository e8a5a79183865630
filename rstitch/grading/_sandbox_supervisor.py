"""Supervisor of one sandboxed program (run as ``python -I _sandbox_supervisor.py CONFIG_JSON``).

Standard library only, so it runs isolated (``-I``) from the caller's environment. Steps:
drop root to the unprivileged user, enter new user/PID/network/mount namespaces where the kernel
allows, hide the world-writable directories behind private tmpfs mounts, then fork the program as
PID 1 of the new PID namespace with resource limits and wait for it. Killing that PID 1 kills every
process the program started, so a fork loop or a daemonized child cannot outlive the sample. The
verdict is one JSON line on stdout; the program's own output goes to files in its working directory.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable: 'nobody' could write there

_libc = ctypes.CDLL(None, use_errno=True)


def main() -> None:
    config = json.loads(sys.argv[1])
    os.chdir(config["workdir"])
    isolation = {"user": _drop_root(config["uid"]), "interpreter": config["argv"][0]}
    stdout = os.open("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stderr = os.open("stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stdin = os.open(config["stdin"] or os.devnull, os.O_RDONLY)
    isolation.update(_enter_namespaces())
    child = os.fork()
    if child == 0:
        _exec_program(config, stdin, stdout, stderr)
    print(json.dumps({**_wait(child, config["timeout_s"]), "isolation": isolation}), flush=True)


def _drop_root(uid: int | None) -> str:
    """As root, become ``uid`` (nobody): process limits then count, files and signals are denied."""
    if os.getuid() != 0 or uid is None:
        return f"uid {os.getuid()} (not dropped)"
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    return f"uid {uid}"


def _enter_namespaces() -> dict[str, bool]:
    """New user+PID+network(+mount) namespaces; each part is best effort and reported."""
    flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
    if _libc.unshare(flags | CLONE_NEWNS) == 0:
        return {"pid_namespace": True, "no_network": True, "private_tmp": _private_tmp()}
    if _libc.unshare(flags) == 0:
        return {"pid_namespace": True, "no_network": True, "private_tmp": False}
    return {"pid_namespace": False, "no_network": False, "private_tmp": False}


def _private_tmp() -> bool:
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    ok = True
    for path in PRIVATE_TMPFS:
        if os.path.isdir(path):
            ok &= _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=16m") == 0
    return ok


def _exec_program(config: dict, stdin: int, stdout: int, stderr: int) -> None:
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor dies -> so does the program
        os.setpgid(0, 0)  # without a PID namespace, the group is what the supervisor can kill
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            os.dup2(fd, target)
        _set_limits(config)
        os.execve(config["argv"][0], config["argv"], config["env"])
    except BaseException as err:  # noqa: BLE001 - report and leave; never return into the supervisor
        os.write(2, f"sandbox: cannot start the program: {err}\n".encode())
    os._exit(127)


def _set_limits(config: dict) -> None:
    cpu = int(config["cpu_s"])
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (config["memory_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (config["max_file_bytes"],) * 2,
        resource.RLIMIT_NOFILE: (64, 64),
        resource.RLIMIT_CORE: (0, 0),
    }
    if config["max_processes"] is not None:
        limits[resource.RLIMIT_NPROC] = (config["max_processes"],) * 2
    for kind, value in limits.items():
        resource.setrlimit(kind, value)


def _wait(child: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            _kill_group(child)  # leftovers of a program that exited (gone already in a PID namespace)
            return _verdict(status, timed_out=False)
        if time.monotonic() >= deadline:
            _kill_group(child)  # PID 1 of its namespace: takes every descendant with it
            _, status = os.waitpid(child, 0)
            return _verdict(status, timed_out=True)
        time.sleep(0.005)


def _kill_group(leader: int) -> None:
    try:
        os.killpg(leader, signal.SIGKILL)
    except OSError:
        pass


def _verdict(status: int, timed_out: bool) -> dict:
    if os.WIFSIGNALED(status):
        return {"exit_code": None, "signal": os.WTERMSIG(status), "timed_out": timed_out}
    return {"exit_code": os.WEXITSTATUS(status), "signal": None, "timed_out": timed_out}


if __name__ == "__main__":
    main()
