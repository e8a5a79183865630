"""The sandbox against hostile programs: each one fails its sample, and the caller, the machine and
the files outside the working directory are untouched. Short limits keep the suite fast."""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rstitch.errors import ConfigError
from rstitch.grading import sandbox, sandbox_cgroup, sandbox_root
from rstitch.grading.sandbox import SUPERVISOR_GRACE_S, SandboxLimits, fitting_process_count, run_python
from rstitch.grading.sandbox_probe import memory_hog

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
    assert first.ok and first.stdout.strip() == "['main.py']"
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
    assert {"cgroup", "disk_limit", "private_proc", "whole_sample"} <= set(result.isolation)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)


# --------------------------------------------------------------------------- hostile solutions (issue 41)
# Each attack below worked against the sandbox that read its outputs back by path and limited
# memory, processes and disk per process only.

def test_an_output_replaced_by_a_link_does_not_leak_the_callers_environment_or_files(tmp_path, monkeypatch):
    monkeypatch.setenv("RSTITCH_TEST_SECRET", "hunter2-env")
    private = tmp_path / "root-only.txt"
    private.write_text("hunter2-file\n")
    private.chmod(0o600)
    source = ("import os\n"
              "for name in ('stderr.txt', 'stdout.txt'):\n"
              "    try:\n        os.remove(name)\n    except OSError:\n        pass\n"
              "os.symlink('/proc/self/environ', 'stderr.txt')\n"
              f"os.symlink({str(private)!r}, 'stdout.txt')\n"
              "raise SystemExit(1)")
    result = run(source)
    assert not result.ok
    returned = result.stdout + result.stderr + getattr(result, "report", "")
    assert "hunter2" not in returned
    caller_environment = [e for e in Path("/proc/self/environ").read_bytes().decode(errors="replace").split("\0") if len(e) >= 12]
    assert caller_environment and not [entry for entry in caller_environment if entry in returned]


def test_a_fifo_in_place_of_an_output_cannot_stall_the_caller():
    source = ("import os\n"
              "for name in ('stdout.txt', 'stderr.txt'):\n"
              "    try:\n        os.remove(name)\n    except OSError:\n        pass\n"
              "    os.mkfifo(name)\n")
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(run(source)), daemon=True)
    worker.start()
    worker.join(FAST.timeout_s + SUPERVISOR_GRACE_S + 5)
    assert outcome, "run_python did not return"
    assert outcome[0].ok and outcome[0].stdout == ""


def test_a_leftover_process_holding_the_output_pipe_does_not_extend_the_run():
    source = ("import os, time\n"
              "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
              "print('parent done')")
    start = time.monotonic()
    result = run(source)
    assert result.ok and result.stdout == "parent done\n"
    assert time.monotonic() - start < FAST.timeout_s + SUPERVISOR_GRACE_S


def test_host_command_lines_are_not_visible_in_proc():
    token = f"--token=rstitch-{os.getpid()}-visible"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", token])
    try:
        source = ("import os\nseen = []\n"
                  "for pid in os.listdir('/proc'):\n"
                  "    try:\n        seen.append(open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace'))\n"
                  "    except OSError:\n        pass\n"
                  "print(len([p for p in os.listdir('/proc') if p.isdigit()]))\nprint(seen)")
        result = run(source)
    finally:
        holder.kill()
        holder.wait()
    assert result.ok and token not in result.stdout and result.isolation["private_proc"] == "fresh"
    assert int(result.stdout.splitlines()[0]) <= 2  # the program (and at most a helper it started)


def test_memory_is_limited_for_the_sample_as_a_whole():
    if os.getuid() != 0:
        pytest.skip("a per-sample cgroup needs root")
    limits = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_bytes=256 * 1024**2, max_output_bytes=64 * 1024, max_processes=16)
    result = run_python(memory_hog(96), limits=limits)  # 4 x 96 MiB would fit 256 MiB each, not together
    assert result.stdout.strip() in {"0", "1", "2"}, (result.stdout, result.isolation)
    assert "cgroup" in result.isolation.get("whole_sample", "")


def test_the_memory_probe_counts_children_that_hold_their_memory_together():
    """The control for the test above: under a limit that fits all four, all four are counted."""
    limits = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_bytes=512 * 1024**2, max_output_bytes=64 * 1024, max_processes=16)
    assert run_python(memory_hog(32), limits=limits).stdout.strip() == "4"


def test_processes_are_limited_for_the_sample_as_a_whole():
    if os.getuid() != 0:
        pytest.skip("a per-sample cgroup needs root")
    source = ("import os, time\ncount = 1\n"
              "try:\n    for _ in range(40):\n        if os.fork() == 0:\n            time.sleep(5)\n            os._exit(0)\n        count += 1\n"
              "except OSError:\n    pass\nprint(count)")
    result = run_python(source, limits=SandboxLimits(timeout_s=3.0, cpu_s=3, memory_bytes=512 * 1024**2, max_processes=8))
    assert int(result.stdout.strip()) <= 8


def test_without_a_cgroup_the_process_count_is_cut_so_the_product_fits_the_machine(monkeypatch):
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert fitting_process_count(SandboxLimits(memory_bytes=machine // 4, max_processes=32)) == 2
    assert fitting_process_count(SandboxLimits(memory_bytes=machine * 2, max_processes=32)) == 1
    assert fitting_process_count(SandboxLimits(memory_bytes=1024**2, max_processes=32)) == 32
    monkeypatch.setattr(sandbox, "sample_cgroup", lambda *args: None)
    result = run("print('hi')")
    assert result.ok and result.isolation["whole_sample"].startswith("no cgroup")


def test_the_working_directory_has_a_total_size_limit():
    limits = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_bytes=512 * 1024**2, max_output_bytes=64 * 1024, disk_bytes=2 * 1024**2)
    source = ("written = 0\ntry:\n    for i in range(80):\n        with open(f'f{i}', 'wb') as handle:\n"
              "            handle.write(b'x' * 65536)\n        written += 1\nexcept OSError as err:\n    print(type(err).__name__)\n"
              "print(written)\n"
              "try:\n    with open('/tmp/extra', 'wb') as handle:\n        handle.write(b'x' * 1024**2)\n    print('tmp ok')\n"
              "except OSError:\n    print('tmp full')")
    result = run_python(source, limits=limits)
    lines = result.stdout.splitlines()
    assert result.ok and lines[0] == "OSError" and int(lines[1]) < 32 and lines[2] == "tmp full"
    assert result.isolation["disk_limit"] is True


def test_no_sandbox_directory_is_left_behind():
    before = set(Path("/tmp").glob("rstitch-sandbox-*"))
    run("import os\nos.symlink('/', 'root')\nos.mkdir('d')\nopen('d/f', 'w').write('x')\nos.chmod('d', 0)")
    run("while True:\n    pass")
    assert set(Path("/tmp").glob("rstitch-sandbox-*")) - before == set()


HUNG_SUPERVISOR = """
import json, os, sys, time
config = json.loads(sys.stdin.read())
for path in config["cgroup_procs"]:
    with open(path, "w") as handle:
        handle.write(str(os.getpid()))
if os.fork() == 0:
    os.setsid()  # out of the supervisor's session, still holding its stdout
with open(os.environ.get("PIDS", "/dev/null"), "a") as handle:
    handle.write(f"{os.getpid()}\\n")
time.sleep(120)
"""


def test_a_hung_supervisor_is_abandoned_in_time_and_its_processes_removed(tmp_path, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("the leftover is removed through the sample's cgroup, which needs root")
    fake = tmp_path / "hung_supervisor.py"
    fake.write_text(HUNG_SUPERVISOR)
    monkeypatch.setattr(sandbox, "SUPERVISOR", fake)
    monkeypatch.setattr(sandbox, "SUPERVISOR_GRACE_S", 1.0)
    start = time.monotonic()
    result = run_python("print(1)", limits=SandboxLimits(timeout_s=1.0))
    assert result.status == "sandbox_error" and "did not return" in result.stderr
    assert time.monotonic() - start < 1.0 + 1.0 + 3.0
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(fake) in _cmdline(p)]
    assert leftovers == []


def test_a_cgroup_v2_hierarchy_gets_one_group_with_memory_pids_and_no_swap(tmp_path, monkeypatch):
    """The v2 branch, on a directory laid out as a unified hierarchy (this kind of machine may be v1)."""
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(sandbox_cgroup, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(sandbox_cgroup.os, "getuid", lambda: 0)
    made = sandbox_cgroup.sample_cgroup(256 * 1024**2, 8)
    assert made is not None and made.version == 2 and len(made.dirs) == 1
    group = made.dirs[0]
    assert group.parent == tmp_path / sandbox_cgroup.V2_PARENT
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (group.parent / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (group / "memory.max").read_text() == str(256 * 1024**2)
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "pids.max").read_text() == "9"  # the supervisor joins it too
    assert made.procs_files == [str(group / "cgroup.procs")]


def test_a_v2_hierarchy_without_the_memory_controller_falls_back_to_v1_or_none(tmp_path, monkeypatch):
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    monkeypatch.setattr(sandbox_cgroup, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(sandbox_cgroup.os, "getuid", lambda: 0)
    monkeypatch.setattr(sandbox_cgroup, "_own_v1_paths", lambda: {"memory": "/", "pids": "/"})
    assert sandbox_cgroup.sample_cgroup(1024**3, 8) is None  # no v1 memory hierarchy under it either
    for controller, limit_file in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max")):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / limit_file).write_text("max")
    made = sandbox_cgroup.sample_cgroup(1024**3, 8)
    assert made is not None and made.version == 1
    memory_dir, pids_dir = made.dirs
    assert (memory_dir / "memory.limit_in_bytes").read_text() == str(1024**3)
    assert (memory_dir / "memory.memsw.limit_in_bytes").read_text() == str(1024**3)
    assert (pids_dir / "pids.max").read_text() == "9"


# --------------------------------------------------------------------------- the empty root (issue 60)
# Against the sandbox that ran programs on the host's file system, a program read every
# world-readable file (the project's source, /etc/passwd, a user's tokens where it kept their uid)
# and wrote files that outlived the sample (/run/lock, /var/lock).

PROJECT = Path(__file__).resolve().parents[2]
needs_bubblewrap = pytest.mark.skipif(sandbox_root.bubblewrap() is None, reason=sandbox_root.MISSING)
SYSTEM_PYTHON = "/usr/bin/python3"


def hostile_program(readable: list[str], writable_dirs: list[str], token: str) -> str:
    """Reads each path, walks / for files outside the interpreter and libraries, and writes a file
    named ``token`` into each directory; prints what it got as JSON."""
    return f"""
import json, os
got = {{}}
for path in {readable!r}:
    try:
        with open(path, 'rb') as handle:
            got[path] = handle.read(4096).decode(errors='replace')
    except OSError as err:
        got[path] = type(err).__name__
files = []
for top, dirs, names in os.walk('/'):
    if top.startswith(('/proc', '/usr', '/lib', '/sys')):
        dirs[:] = []
        continue
    files += [os.path.join(top, name) for name in names if not top.startswith(('/tmp', '/dev'))]
    if len(files) > 10000:
        break
wrote = []
for directory in {writable_dirs!r}:
    try:
        with open(os.path.join(directory, {token!r}), 'w') as handle:
            handle.write('left behind')
        wrote.append(directory)
    except OSError:
        pass
print(json.dumps({{'got': got, 'files': files[:20], 'file_count': len(files), 'wrote': wrote, 'root': sorted(os.listdir('/'))}}))
"""


@pytest.fixture
def canary():
    """A world-readable file beside the project (where the old sandbox's programs read 198 .py
    files), its text unique to this test; removed afterwards."""
    name = f".rstitch-canary-{os.getpid()}-{time.monotonic_ns()}"
    text = f"canary text {secrets.token_hex(8)}"  # not in its name: a listing does not give it away
    path = PROJECT / name
    path.write_text(text + "\n")
    path.chmod(0o644)
    yield path, text
    path.unlink(missing_ok=True)


WRITABLE_ON_HOSTS = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/run", "/", str(PROJECT)]


def assert_nothing_seen_or_left(outcome: dict, canary_text: str, token: str, extra_dirs: list[str]) -> None:
    shown = json.dumps(outcome)
    assert canary_text not in shown and "root:x:0:0" not in shown and "def run_python" not in shown
    assert all(value in ("FileNotFoundError", "PermissionError") for value in outcome["got"].values()), outcome["got"]
    assert outcome["file_count"] == 0, outcome["files"]
    assert set(outcome["root"]) <= {"dev", "proc", "tmp", "var", "usr", "lib", "lib64", "lib32", "bin", "root", "opt", "home"}
    left = [d for d in [*WRITABLE_ON_HOSTS, *extra_dirs] if Path(d, token).exists()]
    for directory in left:
        Path(directory, token).unlink()
    assert left == []


@needs_bubblewrap
def test_a_hostile_program_reads_no_host_file_and_leaves_none(canary):
    path, text = canary
    token = f"left-{path.name}"
    readable = [str(path), "/etc/passwd", str(PROJECT / "rstitch" / "grading" / "sandbox.py"), "/root/.netrc",
                f"/proc/1/root{path}"]
    result = run_python(hostile_program(readable, [*WRITABLE_ON_HOSTS, str(path.parent)], token),
                        limits=SandboxLimits(timeout_s=20.0, cpu_s=20, memory_bytes=512 * 1024**2))
    assert result.ok, result.stderr
    outcome = json.loads(result.stdout)
    assert "/tmp" in outcome["wrote"]  # the sample's own tmpfs works; its files go with it
    assert_nothing_seen_or_left(outcome, text, token, [])
    assert not result.isolation["empty_root"].startswith("none")


AS_USER = """
import json, sys
sys.path.insert(0, {project!r})
sys.path.extend({extra_paths!r})
from rstitch.grading.sandbox import SandboxLimits, run_python
result = run_python({source!r}, limits=SandboxLimits(timeout_s=20.0, cpu_s=20, memory_bytes=512 * 1024**2))
print(json.dumps({{"status": result.status, "stdout": result.stdout, "stderr": result.stderr, "isolation": result.isolation}}))
"""


@pytest.fixture
def ordinary_user(tmp_path):
    """A fresh user with a home holding credentials only it may read (a researcher on a shared node)."""
    if os.getuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser") or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("making a user needs root, useradd, runuser and a system Python")
    name = f"rstitch-sbx-{os.getpid() % 100000}"
    home = Path("/home") / name
    made = subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin", name],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        yield name, home
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)


def readable_copy_of(spec, folder: Path, owner: str) -> Path:
    """Copy a module (a file or a package) where ``owner`` can read it: this process's own environment may sit
    in a folder only its user may enter (a fresh venv under a private temporary folder)."""
    origin = Path(str(spec.origin))
    folder.mkdir()
    if spec.submodule_search_locations:
        shutil.copytree(origin.parent, folder / origin.parent.name)
    else:
        shutil.copy2(origin, folder / origin.name)
    subprocess.run(["chown", "-R", f"{owner}:{owner}", str(folder)], check=True)
    return folder


@needs_bubblewrap
def test_as_an_ordinary_user_a_hostile_program_sees_neither_the_users_files_nor_the_host(canary, ordinary_user):
    path, text = canary
    name, home = ordinary_user
    netrc = home / ".netrc"
    netrc.write_text(f"machine huggingface.co login me password {text}-token\n")
    shutil.chown(netrc, name, name)
    netrc.chmod(0o600)
    token = f"left-{path.name}"
    source = hostile_program([str(path), str(netrc), "/etc/passwd", str(PROJECT / "pyproject.toml")],
                             [*WRITABLE_ON_HOSTS, str(home), str(path.parent)], token)
    seccomp = importlib.util.find_spec("pyseccomp")  # where this process has it, the user's finds a copy of it
    extra_paths = [str(readable_copy_of(seccomp, home / "site", name))] if seccomp else []
    script = AS_USER.format(project=str(PROJECT), extra_paths=extra_paths, source=source)
    runuser = str(shutil.which("runuser"))
    check = subprocess.run([runuser, "-u", name, "--", SYSTEM_PYTHON, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "import rstitch.grading.sandbox", str(PROJECT)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    if check.returncode != 0:
        pytest.skip(f"the project is not importable by another user here: {check.stderr.strip()[-200:]}")
    done = subprocess.run([runuser, "-u", name, "--", SYSTEM_PYTHON, "-I", "-c", script], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, cwd=str(home), timeout=60, check=False)
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok", reply["stderr"]
    outcome = json.loads(reply["stdout"])
    assert_nothing_seen_or_left(outcome, text, token, [str(home)])
    assert "(not dropped)" in reply["isolation"]["user"] and not reply["isolation"]["empty_root"].startswith("none")
    assert seccomp is None or not reply["isolation"]["seccomp"].startswith("not applied"), reply["isolation"]["seccomp"]


@needs_bubblewrap
def test_as_root_without_an_interpreter_nobody_can_run_the_program_is_uid_65534_of_its_own_namespace(monkeypatch):
    if os.getuid() != 0:
        pytest.skip("the caller must be root")
    monkeypatch.setattr(sandbox, "_runnable_by_others", lambda path: False)
    result = run("import os\nprint(os.getuid())\nprint(os.path.exists('/etc/passwd'))")
    assert result.ok and result.stdout.splitlines() == ["65534", "False"], result.stderr
    assert result.isolation["user"].startswith("uid 65534 in a user namespace of its own")


@needs_bubblewrap
def test_a_seccomp_filter_refuses_what_a_test_program_never_needs():
    source = ("import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "status = open('/proc/self/status').read()\n"
              "print([line.split()[1] for line in status.splitlines() if line.startswith('Seccomp:')][0])\n"
              "for call in (lambda: libc.ptrace(16, 1, 0, 0), lambda: libc.unshare(0x10000000),\n"
              "             lambda: libc.mount(b'x', b'/tmp', b'tmpfs', 0, None)):\n"
              "    ctypes.set_errno(0)\n    print(call(), errno.errorcode.get(ctypes.get_errno()))")
    result = run(source)
    if result.isolation["seccomp"].startswith("not applied"):
        pytest.skip(result.isolation["seccomp"])
    assert result.ok and result.stdout.splitlines() == ["2", "-1 EPERM", "-1 EPERM", "-1 EPERM"], result.stdout


def test_without_bubblewrap_the_weaker_mode_says_so_and_code_benchmarks_need_consent(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "bubblewrap", lambda: None)
    result = run("print('on the host')")
    assert result.ok and result.isolation["empty_root"].startswith("none: bubblewrap (bwrap) is not installed")
    with pytest.raises(ConfigError, match=r"bubblewrap \(bwrap\) is not installed.*weak_code_sandbox=true") as err:
        sandbox.check_code_sandbox()
    assert "\n" not in str(err.value)
    with caplog.at_level("WARNING"):
        assert sandbox.check_code_sandbox(allow_weak=True)["empty_root"].startswith("none")
    assert "weak_code_sandbox=true" in caplog.text


@needs_bubblewrap
def test_code_benchmarks_run_on_the_empty_root_without_consent():
    isolation = sandbox.check_code_sandbox()
    assert isolation["empty_root"].startswith("bubblewrap") and isolation["private_proc"] == "fresh"


def test_a_sandbox_that_cannot_start_is_one_line(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_argv", lambda *args: ["/bin/false", "--"])
    result = run("print(1)")
    assert result.status == "sandbox_error" and "the empty root did not start" in result.stderr
    with pytest.raises(ConfigError, match="the code sandbox cannot run a program here"):
        sandbox.check_code_sandbox()


def test_a_code_benchmark_run_refuses_the_weaker_mode_before_anything_loads(monkeypatch, tmp_path):
    from rstitch import runner

    monkeypatch.setattr(sandbox, "bubblewrap", lambda: None)
    from rstitch.config_groups import compose_config

    cfg = compose_config(["method=llm_only", "n_samples=1", "max_new_tokens=4", "logger=none", "dataset=humaneval",
                          f"dataset.path={PROJECT / 'tests' / 'fixtures' / 'humaneval.jsonl'}"])
    cfg = {k: v for k, v in cfg.items() if k not in ("logger", "results_root")}
    with pytest.raises(ConfigError, match="weak_code_sandbox=true"):
        runner.run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
