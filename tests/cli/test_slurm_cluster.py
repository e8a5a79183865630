"""The Slurm launchers on a real cluster: docs/scale-out.md's CPU recipe end to end, each way a
sweep used to hang or lose samples. No mock: `sbatch`, `squeue`, `scontrol` and `scancel` of a
running cluster (locally: `.ci/slurm-up.sh`, a one-node cluster on localhost without accounting,
as .ci/run starts it). Without one these tests skip; with RSTITCH_REQUIRE_SLURM=1 (CI) they fail.
Decodes are the testbed pair's, a few tokens each, one thread per job."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REQUIRE_SLURM = "RSTITCH_REQUIRE_SLURM"
TINY = ("engine.num_threads=1", "logger=none", "max_new_tokens=16", "dataset.limit=2")
COMPARED_FIELDS = ("id", "sample_index", "output_token_ids", "token_sources", "answer", "correct", "tokens")


def cluster_problem() -> str | None:
    """Why no Slurm cluster can run jobs here, or None."""
    missing = [c for c in ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun") if shutil.which(c) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH (apt-get install slurm-wlm munge; .ci/slurm-up.sh)"
    probe = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    states = probe.stdout.split()
    if probe.returncode != 0 or not any(s.rstrip("*~#").startswith(("idle", "mix", "alloc")) for s in states):
        return f"no Slurm node up (sinfo: {probe.stderr.strip() or ' '.join(states) or 'nothing'}; .ci/slurm-up.sh starts one)"
    return None


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> None:
    problem = cluster_problem()
    if problem and os.environ.get(REQUIRE_SLURM) == "1":
        pytest.fail(f"{REQUIRE_SLURM}=1 and {problem}")
    if problem:
        pytest.skip(problem)


def readme_slurm_command() -> tuple[str, ...]:
    """The README's Slurm command as written (its arguments, without the comment)."""
    readme = Path(__file__).resolve().parents[2] / "README.md"
    [line] = [line for line in readme.read_text().splitlines() if line.startswith("rstitch-run -m hydra/launcher=slurm_cpu ")]
    return tuple(shlex.split(line.split("#", 1)[0])[1:])


def rstitch_run(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "rstitch.cli.run", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=timeout)


def start_rstitch_run(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rstitch.cli.run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def samples(run_dir: Path) -> list[tuple]:
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    return [tuple(json.dumps(json.loads(line)[f]) for f in COMPARED_FIELDS) for line in lines]


def method_dirs(root: Path, method: str) -> list[Path]:
    return sorted((root / "testbed" / "testbed" / method).glob("*"))


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("rstitch-run: error:")]


def table_rows(stdout: str, *methods: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.split()[:1] and line.split()[0] in methods]


def array_of(proc_stdout: str) -> str:
    line = next(line for line in proc_stdout.splitlines() if line.startswith("rstitch-run: submitted Slurm job "))
    return line.split()[4]


def queued(array: str) -> list[str]:
    return subprocess.run(["squeue", "-h", "-r", "-j", array, "-o", "%i %T"], capture_output=True, text=True).stdout.split("\n")[:-1]


def test_the_documented_cpu_recipe_completes_with_speedups_and_its_own_table(tmp_path):
    """The README's command (docs/scale-out.md's first): parallel array tasks share the baseline (baseline=auto), every
    speedup is filled in even where a point finished first, the array id is printed, no sacct
    polling; a sweep run at the same time under the same results_root stays out of the table."""
    root = tmp_path / "runs"
    recipe = (*readme_slurm_command(), f"results_root={root}")
    assert recipe[:2] == ("-m", "hydra/launcher=slurm_cpu") and "baseline=auto" in recipe
    concurrent = start_rstitch_run(tmp_path, "-m", "hydra/launcher=slurm_cpu", "method=slm_only", f"results_root={root}", *TINY)
    proc = rstitch_run(tmp_path, *recipe)
    concurrent_out, concurrent_err = concurrent.communicate(timeout=300)
    assert proc.returncode == 0 and concurrent.returncode == 0, proc.stderr[-2000:] + concurrent_err[-2000:]
    assert array_of(proc.stdout) != array_of(concurrent_out)
    assert "Bypassing sacct" not in proc.stderr + proc.stdout
    [llm_only], [rstitch] = method_dirs(root, "llm_only"), method_dirs(root, "rstitch")
    assert summary(rstitch)["speedup"] == pytest.approx(summary(llm_only)["latency_s"] / summary(rstitch)["latency_s"])
    assert f"sweep: 2 runs under {root}" in proc.stdout and not table_rows(proc.stdout, "slm_only")  # its own runs only
    assert f"sweep: 1 runs under {root}" in concurrent_out and not table_rows(concurrent_out, "rstitch", "llm_only")
    assert array_of(proc.stdout) and (root / ".submitit" / f"{array_of(proc.stdout)}_0").is_dir()  # the documented log folder
    rerun = rstitch_run(tmp_path, *recipe)  # a no-op rerun: nothing decoded, the same table
    assert rerun.returncode == 0 and f"sweep: 2 runs under {root}" in rerun.stdout
    assert len(samples(rstitch)) == 2


def test_requests_that_no_node_meets_are_one_line_before_anything_is_submitted(tmp_path):
    for launcher, needle in [("hydra/launcher=slurm", "hydra.launcher.gpus_per_node=1 does not fit"),
                             ("hydra/launcher=slurm_gpu", "use hydra/launcher=slurm_cpu"),
                             ("hydra.launcher.cpus_per_task=4096", "hydra.launcher.cpus_per_task=4096 does not fit"),
                             ("hydra.launcher.mem_gb=100000", "hydra.launcher.mem_gb=100000 does not fit"),
                             ("hydra.launcher.partition=nosuch", "no such Slurm partition")]:
        args = [launcher] if launcher.startswith("hydra/") else ["hydra/launcher=slurm_cpu", launcher]
        proc = rstitch_run(tmp_path, "-m", *args, "method.tau=0.01,0.02", f"results_root={tmp_path / 'runs'}", *TINY, timeout=120)
        assert proc.returncode == 2 and len(error_lines(proc)) == 1 and needle in error_lines(proc)[0], proc.stderr[-2000:]
        assert not (tmp_path / "runs").exists()  # no submission file, no run


def test_an_invalid_later_point_is_refused_before_submission(tmp_path):
    proc = rstitch_run(tmp_path, "-m", "hydra/launcher=slurm_cpu", "method=rstitch", "baseline=auto", "dataset.shard=0,5",
                       "dataset.num_shards=2", f"results_root={tmp_path / 'runs'}", *TINY, timeout=120)
    [line] = error_lines(proc)
    assert proc.returncode == 2 and "dataset.shard=5" in line and "must be an integer in [0, 1]" in line
    assert "submitted Slurm job" not in proc.stdout and not (tmp_path / "runs").exists()


def test_an_error_inside_a_job_reaches_the_submitter_as_one_line(tmp_path):
    """A point that fails only once its job runs (max_new_tokens=0 passes composition): the sweep
    ends, exit 2, one line naming the point, its job and its log; the other point's run is kept."""
    root = tmp_path / "runs"
    proc = rstitch_run(tmp_path, "-m", "hydra/launcher=slurm_cpu", "method=rstitch", "max_new_tokens=16,0", "dataset.limit=2",
                       "engine.num_threads=1", "logger=none", f"results_root={root}")
    [line] = error_lines(proc)
    array = array_of(proc.stdout)
    assert proc.returncode == 2 and "max_new_tokens=0" in line and "max_new_tokens must be an integer >= 1" in line
    assert f"job {array}_1" in line and f".submitit/{array}_1/{array}_1_0_log.err" in line
    assert [summary(d)["n_samples"] for d in method_dirs(root, "rstitch")] == [2]


def test_shards_on_the_cluster_merge_into_the_unsharded_run(tmp_path):
    sharded, whole = tmp_path / "sharded", tmp_path / "whole"
    config = ("method=rstitch", "dataset.limit=4", "max_new_tokens=16", "engine.num_threads=1", "logger=none")
    proc = rstitch_run(tmp_path, "-m", "hydra/launcher=slurm_cpu", "dataset.shard=0,1", "dataset.num_shards=2",
                       f"results_root={sharded}", *config)
    assert proc.returncode == 0, proc.stderr[-2000:]
    merge = subprocess.run([sys.executable, "-m", "rstitch.cli.merge", "--all", str(sharded)], capture_output=True, text=True, timeout=300)
    assert merge.returncode == 0, merge.stderr[-2000:]
    assert rstitch_run(tmp_path, f"results_root={whole}", *config).returncode == 0  # the same run unsharded, no launcher
    [merged] = [d for d in method_dirs(sharded, "rstitch") if "shard=" not in d.name]
    [unsharded] = method_dirs(whole, "rstitch")
    assert merged.name == unsharded.name and samples(merged) == samples(unsharded)


def wait_for_samples(run_glob: str, root: Path, at_least: int, timeout: float = 240) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for path in root.glob(run_glob):
            if path.is_file() and path.read_bytes().count(b"\n") >= at_least:
                return path.parent
        time.sleep(0.5)
    raise AssertionError(f"no {run_glob} with {at_least} samples under {root} after {timeout} s")


def test_a_cancelled_job_stops_reports_and_resumes_to_the_uninterrupted_samples(tmp_path):
    """scancel of one array task: its decode stops after the sample in flight (SIGTERM), the
    submitter ends with one line instead of waiting, and the same command resumes the point to
    the samples an uninterrupted run decodes."""
    root, reference = tmp_path / "runs", tmp_path / "reference"
    config = ("method=rstitch", "dataset.limit=30", "max_new_tokens=128", "engine.num_threads=1", "logger=none")
    sweep = ("-m", "hydra/launcher=slurm_cpu", "method.tau=0.01,0.03", f"results_root={root}", *config)
    submitter = start_rstitch_run(tmp_path, *sweep)
    run_dir = wait_for_samples("testbed/testbed/rstitch/tau=0.03_*/samples.jsonl", root, at_least=2)
    array = next(line.split()[0].split("_")[0] for line in queued_all() if line.split()[0].endswith("_1"))
    subprocess.run(["scancel", f"{array}_1"], check=True)
    cancelled_at = time.time()
    out, err = submitter.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.startswith("rstitch-run: error:")]
    assert submitter.returncode == 2 and len(lines) == 1 and "method.tau=0.03" in lines[0], err[-2000:]
    assert "interrupted:" in lines[0] or "ended CANCELLED" in lines[0]
    log = (root / ".submitit" / f"{array}_1" / f"{array}_1_0_log.err").read_text()
    assert "rstitch-run: interrupted:" in log  # stopped by SIGTERM, not killed after KillWait
    saved = len(samples(run_dir))
    assert 2 <= saved < 30 and time.time() - cancelled_at < 120
    resumed = rstitch_run(tmp_path, *sweep)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert rstitch_run(tmp_path, "method.tau=0.03", f"results_root={reference}", *config).returncode == 0
    [uninterrupted] = [d for d in method_dirs(reference, "rstitch") if d.name.startswith("tau=0.03")]
    assert samples(run_dir) == samples(uninterrupted)  # none lost, none doubled, each as decoded in one go


def queued_all() -> list[str]:
    return [line for line in subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True).stdout.splitlines() if line]


def test_ctrl_c_of_the_submitter_cancels_its_array(tmp_path):
    submitter = start_rstitch_run(tmp_path, "-m", "hydra/launcher=slurm_cpu", "method=rstitch", "method.tau=0.01,0.03",
                                  "dataset.limit=30", "max_new_tokens=128", "engine.num_threads=1", "logger=none",
                                  f"results_root={tmp_path / 'runs'}")
    assert submitter.stdout is not None
    line = submitter.stdout.readline()
    while line and not line.startswith("rstitch-run: submitted Slurm job "):
        line = submitter.stdout.readline()
    array = line.split()[4]
    time.sleep(3)
    submitter.send_signal(signal.SIGINT)
    _, err = submitter.communicate(timeout=120)
    assert submitter.returncode == 130 and f"cancelled Slurm job {array} (scancel {array})" in err, err[-2000:]
    deadline = time.time() + 60
    while queued(array) and time.time() < deadline:
        time.sleep(1)
    assert not queued(array)
