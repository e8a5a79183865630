"""The program's empty root: bubblewrap (``bwrap``), every namespace new, a seccomp filter
(docs/sandbox.md, "What the program sees"); without bwrap the supervisor's namespaces (``MISSING``)."""
from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

INSIDE_WORKDIR = "/tmp"  # the program's working directory and HOME: the root of the sample's tmpfs
SOURCE_FD, SECCOMP_FD = 5, 6  # what bwrap reads main.py and the seccomp program from
STARTED_FD = 4  # the program's first act inside the root: one byte here (else the root never came up)
SHM_BYTES = 1024**2  # /dev/shm: its own tmpfs, enough for multiprocessing's semaphores
BWRAP_PROCESSES = 2  # bwrap itself and its PID 1 inside, counted by the process limits
NOBODY_UID = 65534
LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32")
MISSING = "bubblewrap (bwrap) is not installed: code runs on the host's file system; install it (apt-get install bubblewrap)"
# Refused with EPERM: tracing, mounting, namespaces, kernel modules and keys, eBPF, clocks,
# reboot, swap, raw I/O ports, file handles, io_uring. None is needed to run a test program.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "unshare", "setns",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "uselib",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)
# clone() with any of these flags makes a namespace: refused like unshare(). clone3() passes its
# flags in memory a filter cannot read, so it answers ENOSYS and the C library falls back to clone().
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


@functools.lru_cache(maxsize=1)
def bubblewrap() -> str | None:
    """The ``bwrap`` executable, or None (said once in the log)."""
    found = shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)), None)
    if found is None:
        log.warning("sandbox: %s", MISSING)
    return found


@functools.lru_cache(maxsize=1)
def bubblewrap_version() -> str:
    try:
        done = subprocess.run([str(bubblewrap()), "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "bubblewrap"
    return done.stdout.strip() or "bubblewrap"


def interpreter_prefix(python: str) -> str:
    """The installation the interpreter belongs to: the folder above its ``bin``."""
    return str(Path(os.path.realpath(python)).parent.parent)


def bwrap_argv(python: str, disk_bytes: int, map_to_nobody: bool, seccomp: bool) -> list[str]:
    """bwrap's command line up to ``--``. ``map_to_nobody``: the caller stays root, so the program
    gets a user namespace of its own in which it is uid 65534 with no capabilities."""
    argv = [str(bubblewrap()), "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if map_to_nobody:
        argv += ["--unshare-user", "--uid", str(NOBODY_UID), "--gid", str(NOBODY_UID)]
    # The sample's tmpfs first, so that nothing bound later can end up under it unseen.
    argv += ["--perms", "1777", "--size", str(int(disk_bytes)), "--tmpfs", "/tmp", "--symlink", "/tmp", "/var/tmp"]
    prefix = interpreter_prefix(python)  # read-only, with the library directories that exist outside it
    argv += ["--ro-bind", prefix, prefix]
    for path in LIBRARY_DIRS:
        if path != prefix and not path.startswith(prefix.rstrip("/") + "/"):
            argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    argv += ["--file", str(SOURCE_FD), f"{INSIDE_WORKDIR}/main.py", "--chdir", INSIDE_WORKDIR, "--remount-ro", "/"]
    if seccomp:
        argv += ["--seccomp", str(SECCOMP_FD)]
    return [*argv, "--"]


@functools.lru_cache(maxsize=1)
def seccomp_program() -> tuple[bytes | None, str]:
    """(the filter as a BPF program for ``bwrap --seccomp``, what it is) or (None, why there is none)."""
    try:
        import pyseccomp as seccomp
    except ImportError:
        return None, "not applied: the pyseccomp package is not installed"
    except (OSError, RuntimeError) as err:  # the libseccomp shared library is missing
        return None, f"not applied: libseccomp is not available ({err})"
    try:
        rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        denied = [name for name in DENIED_SYSCALLS if _deny(rules, seccomp, name, seccomp.ERRNO(errno.EPERM))]
        _deny(rules, seccomp, "clone3", seccomp.ERRNO(errno.ENOSYS))
        for flag in NAMESPACE_FLAGS:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        with tempfile.TemporaryFile() as handle:
            rules.export_bpf(handle)
            handle.seek(0)
            program = handle.read()
    except (OSError, RuntimeError, ValueError) as err:
        return None, f"not applied: libseccomp refused the filter ({err})"
    return program, f"{len(denied)} system calls refused (ptrace, mount, unshare, kexec, bpf, keyctl, ...), namespaces in clone"


def _deny(rules, seccomp, name: str, action) -> bool:
    """Add one rule; a system call this architecture lacks is skipped."""
    try:
        rules.add_rule(action, name)
    except (RuntimeError, ValueError, OSError):
        return False
    return True
