"""`rstitch-run -m ... hydra/launcher=slurm_cpu|slurm_gpu|local`: Hydra loads launchers only from its plugin
package, so the stock submitit ones run, set up here to end: in a job, a failed run is a `JobError` (a bare
SystemExit leaves submitit no result and its submitter waiting) and scancel stops after the sample in flight;
the submitter reads job states from squeue (submitit asks only sacct, which a cluster without
accounting never answers), and checks the requests against sinfo and `sbatch --test-only` first."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from hydra.errors import CompactHydraException

from rstitch.configs import override_value
from rstitch.errors import ConfigError

SLURM_LAUNCHERS = ("slurm", "slurm_cpu", "slurm_gpu")
SUBMITIT_LAUNCHERS = (*SLURM_LAUNCHERS, "local")
# Pending reasons with which a job never starts: it is cancelled and reported instead of waited on.
NEVER_STARTS = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
                "InvalidQOS", "QOSMax", "AssocMax", "JobHeldAdmin")
UNKNOWN_GRACE_S = 60  # a job squeue does not know is reported after this long


class JobError(CompactHydraException):
    """A run inside a submitit job that failed or was interrupted (pickled back to the submitter)."""


def exit_run(code: int, message: str) -> NoReturn:
    """End `rstitch-run` with `code`, its message printed; in a submitit job, a `JobError` naming point, job and log."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        sys.exit(code)
    import submitit
    from hydra.core.hydra_config import HydraConfig

    env = submitit.JobEnvironment()
    point = " ".join(HydraConfig.get().overrides.task)
    raise JobError(f"{point}: {message} (job {env.job_id}, log {env.paths.stderr})")


def slurm_job_preempted() -> bool:
    """This Slurm job is being preempted or requeued (it runs again), not cancelled (COMPLETING, CANCELLED)."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return False
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(f"JobState={state}" in out for state in ("PREEMPTED", "REQUEUE"))


def job_states(array_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """{job id ('12_3', '12'): {'State', 'Reason'}} from squeue, jobs ended lately included (`-t all`)."""
    squeue = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(array_ids), "-o", "%i|%T|%r"],
                            capture_output=True, text=True)
    info: dict[str, dict[str, str]] = {}
    for line in squeue.stdout.splitlines():
        job_id, state, reason = (line.split("|") + ["", ""])[:3]
        info[job_id.strip()] = {"State": state.strip(), "Reason": reason.strip()}
    return info


def install_slurm_watcher() -> Any:
    """submitit's Slurm jobs watched from now on by a fresh watcher that reads squeue instead of
    sacct, prints each submitted array's id and cancels a job that will never start."""
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

    class SqueueWatcher(SlurmInfoWatcher):
        def __init__(self, delay_s: int = 5) -> None:
            super().__init__(delay_s=delay_s)
            self.arrays: list[str] = []
            self.registered_at: dict[str, float] = {}

        def register_job(self, job_id: str) -> None:
            array_id = job_id.split("_")[0]
            if array_id not in self.arrays:
                self.arrays.append(array_id)
                print(f"rstitch-run: submitted Slurm job {array_id} (one array task per sweep point, logs in "
                      f".submitit/{array_id}_<task>/ under the sweep directory); Ctrl-C cancels it (scancel {array_id})",
                      flush=True)
            self.registered_at.setdefault(job_id, time.time())
            super().register_job(job_id)

        def update(self) -> None:
            waiting = sorted({j.split("_")[0] for j in self._registered - self._finished})
            if not waiting:
                return
            self._num_calls += 1
            info = job_states(waiting)
            for job_id in self._registered - self._finished:
                state = info.get(job_id)
                if state is None and time.time() - self.registered_at.get(job_id, 0) > UNKNOWN_GRACE_S:
                    state = {"State": "NOT_FOUND", "Reason": "squeue does not know it"}
                if state and state["State"] == "PENDING" and state["Reason"].startswith(NEVER_STARTS):
                    subprocess.run(["scancel", job_id], check=False)
                    state = {"State": "CANCELLED", "Reason": f"it would never start ({state['Reason']})"}
                if state:
                    self._info_dict[job_id] = state
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

    SlurmJob.watcher = SqueueWatcher()
    return SlurmJob.watcher


def failure_line(err: BaseException, states: Mapping[str, Mapping[str, str]]) -> str:
    """One line for a job that failed, whatever submitit raised."""
    if isinstance(err, JobError):
        return f"sweep point {err}"
    message = str(err)
    job = re.search(r"Job (\S+) \(task: \d+\) with path (\S+)", message)
    if job:  # submitit's UncompletedJobError: the job ended without writing a result
        job_id, folder = job.group(1), os.path.dirname(job.group(2))
        state = states.get(job_id, {})
        why = f" ({state['Reason']})" if state.get("Reason") not in (None, "", "None") else ""
        return (f"job {job_id} ended {state.get('State', 'without a state')}{why} without a result (log: {folder}/); "
                "the samples it finished are saved: rerun the same command to resume")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return f"a job failed: {lines[-1] if lines else type(err).__name__}"


def wait_for_the_rest(watcher: Any) -> dict[str, dict[str, str]]:
    """Wait until every job the watcher knows has ended (the others go on after one failed)."""
    if watcher is None:
        return {}
    polls = 0
    watcher.update()
    while watcher._registered - watcher._finished - set(watcher.arrays):
        if polls == 3:  # not a job that only completes its exit (COMPLETING) after writing its result
            print(f"rstitch-run: waiting for the other jobs of {' '.join(watcher.arrays)} to end "
                  f"(Ctrl-C cancels them: scancel {' '.join(watcher.arrays)})", file=sys.stderr, flush=True)
        time.sleep(2)
        watcher.update()
        polls += 1
    return dict(watcher._info_dict)


@contextlib.contextmanager
def submitting(argv: Sequence[str]) -> Iterator[None]:
    """Around `rstitch-run -m ... hydra/launcher=<submitit launcher>` in the submitter; other command lines as they are."""
    launcher = override_value(argv, "hydra/launcher")
    if not any(a in ("-m", "--multirun") for a in argv) or launcher not in SUBMITIT_LAUNCHERS:
        yield
        return
    from submitit.core.utils import UncompletedJobError

    watcher = install_slurm_watcher() if launcher in SLURM_LAUNCHERS else None
    os.environ["HYDRA_FULL_ERROR"] = "1"  # a job's error reaches the handlers below, not Hydra's report
    try:
        yield
    except KeyboardInterrupt:
        arrays = watcher.arrays if watcher is not None else []
        if arrays:
            subprocess.run(["scancel", *arrays], check=False)
        cancelled = f"cancelled Slurm job {' '.join(arrays)} (scancel {' '.join(arrays)}); " if arrays else ""
        print(f"\nrstitch-run: interrupted: {cancelled}the samples finished so far are saved: rerun the same command "
              "to resume", file=sys.stderr)
        sys.exit(130)
    except (JobError, UncompletedJobError) as err:
        states = wait_for_the_rest(watcher)
        line = failure_line(err, states)
        print(f"rstitch-run: error: {line}", file=sys.stderr)
        others = sorted(j for j, s in states.items() if s.get("State") not in ("COMPLETED", None) and "_" in j and j not in line)
        if others:
            ended = ", ".join(f"{j} {states[j]['State']}" for j in others)
            print(f"rstitch-run: jobs that did not complete: {ended}", file=sys.stderr)
        sys.exit(2)


def gpu_count(gres: str) -> int:
    """GPUs in a node's sinfo %G field ('gpu:a100:4(S:0-1),shard:8' -> 4; '(null)' -> 0)."""
    return sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", gres))


def minutes(limit: str) -> float:
    """A Slurm time limit ('infinite', '1-00:00:00', '2:00:00', '30:00') in minutes."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return float("inf")
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + h) * 60 + m + s / 60


def partition_nodes(partition: str | None) -> tuple[str, list[dict[str, Any]]]:
    """The partition's name (None: the default) and its nodes' CPUs, memory (MB), GPUs, time limit (min), from sinfo."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G|%l"], capture_output=True, text=True)
    if out.returncode != 0:
        raise ConfigError(f"sinfo failed: {out.stderr.strip() or out.returncode}; is the Slurm controller up?")
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 5]
    partitions = {p.rstrip("*") for _, p, *_ in rows}
    if partition is None:
        defaults = {p.rstrip("*") for _, p, *_ in rows if p.endswith("*")}
        if not defaults:
            raise ConfigError(f"no default Slurm partition: set hydra.launcher.partition (one of {', '.join(sorted(partitions))})")
        partition = defaults.pop()
    if partition not in partitions:
        raise ConfigError(f"hydra.launcher.partition={partition}: no such Slurm partition (sinfo lists {', '.join(sorted(partitions)) or 'none'})")
    nodes = [{"name": n, "cpus": int(c), "mem_mb": int(re.sub(r"\D", "", m) or 0), "gpus": gpu_count(g), "time_min": minutes(t)}
             for n, p, c, m, g, t in rows if p.rstrip("*") == partition]
    return partition, nodes


def check_requests(launcher: Mapping[str, Any]) -> None:
    """The launcher's requests against the partition's nodes, then `sbatch --test-only`: one line for what does not fit."""
    partition, nodes = partition_nodes(launcher.get("partition"))
    cpus = int(launcher.get("cpus_per_task") or 1) * int(launcher.get("tasks_per_node") or 1)
    wanted = {"gpus_per_node": (int(launcher.get("gpus_per_node") or 0), "gpus", "GPUs"), "cpus_per_task": (cpus, "cpus", "CPUs"),
              "mem_gb": (float(launcher.get("mem_gb") or 0) * 1024, "mem_mb", "MB of memory"),
              "timeout_min": (float(launcher.get("timeout_min") or 0), "time_min", "minutes of time limit")}
    for key, (amount, field, unit) in wanted.items():
        largest = max(nodes, key=lambda n: n[field])
        if amount > largest[field]:
            raise ConfigError(f"hydra.launcher.{key}={launcher.get(key)} does not fit partition '{partition}': its largest "
                              f"node ({largest['name']}) has {largest[field]:g} {unit}; lower it, or choose another "
                              f"partition (hydra.launcher.partition=...)"
                              + ("; on CPU nodes use hydra/launcher=slurm_cpu" if key == "gpus_per_node" else ""))
    if not any(all(amount <= n[field] for amount, field, _ in wanted.values()) for n in nodes):
        raise ConfigError(f"no node of partition '{partition}' has all of {cpus} CPUs, {launcher.get('mem_gb')} GB and "
                          f"{launcher.get('gpus_per_node') or 0} GPUs at once (hydra.launcher.*)")
    test = subprocess.run(["sbatch", "--test-only", *sbatch_flags(launcher, partition), "--wrap", "true"],
                          capture_output=True, text=True)
    if test.returncode != 0:
        reason = [line for line in test.stderr.splitlines() if line.strip()]
        raise ConfigError(f"Slurm refuses the requests of hydra.launcher ({' '.join(sbatch_flags(launcher, partition))}): "
                          f"{reason[-1] if reason else test.returncode}")


def sbatch_flags(launcher: Mapping[str, Any], partition: str) -> list[str]:
    """The sbatch options submitit derives from the launcher's settings (those Slurm checks)."""
    flags = [f"--partition={partition}", f"--cpus-per-task={launcher.get('cpus_per_task') or 1}",
             f"--ntasks-per-node={launcher.get('tasks_per_node') or 1}", f"--nodes={launcher.get('nodes') or 1}"]
    optional = {"mem": launcher.get("mem_gb") and f"{int(float(launcher['mem_gb']) * 1024)}M",
                "gpus-per-node": launcher.get("gpus_per_node"),
                "time": launcher.get("timeout_min") and f"{int(launcher['timeout_min'])}",
                **{key: launcher.get(key) for key in ("account", "qos", "constraint")}}
    flags += [f"--{key}={value}" for key, value in optional.items() if value]
    flags += [f"--{key.replace('_', '-')}={value}" for key, value in (launcher.get("additional_parameters") or {}).items()]
    return flags


def install_sigterm_handler(interrupt: Callable[[int, Any], None]) -> None:
    """On SIGTERM, `interrupt` (stop after the sample in flight), but in a Slurm job being preempted, whose
    requeue submitit's handlers do (and it resumes)."""
    def handler(signum: int, frame: Any) -> None:
        if not (os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and slurm_job_preempted()):
            interrupt(signum, frame)

    signal.signal(signal.SIGTERM, handler)
