"""`rstitch-run`: the Hydra app rooted at conf/config.yaml."""
from __future__ import annotations

import shutil
import signal
import sys
import threading
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rstitch.cli.cluster import exit_run, install_sigterm_handler, submitting
from rstitch.cli.preflight import check_command_line
from rstitch.config_groups import compose_config, resolved_run_config  # noqa: F401  (compose_config: scripts and tests import it from here)
from rstitch.configs import CONF_DIR
from rstitch.errors import ConfigError
from rstitch.results import keys


def _identity(root: DictConfig) -> dict:
    """The entries of the config a run's identity is computed from, resolved."""
    return {k: OmegaConf.to_container(root[k], resolve=True) if isinstance(root.get(k), DictConfig) else root.get(k)
            for k in keys.RUN_KEY_FIELDS}


# conf/config.yaml names the run directory (hydra.run.dir, hydra.sweep.subdir) through these, so it
# is the one results/keys.py defines.
OmegaConf.register_new_resolver("run_dir", lambda *, _root_: str(keys.run_dir(_root_.results_root, _identity(_root_))), replace=True)
OmegaConf.register_new_resolver("run_subdir", lambda *, _root_: str(keys.run_subdir(_identity(_root_))), replace=True)


def fail(message: str) -> None:
    print(f"rstitch-run: error: {message}", file=sys.stderr)
    exit_run(2, message)  # in a submitit job: an error its submitter reports


def discard_if_empty(run_dir: Path) -> None:
    """A run that failed on bad input leaves no directory behind (Hydra creates it up front)."""
    if not run_dir.is_dir():
        return
    if all(p.name in (".hydra", ".lock", "run_key.json") or p.suffix == ".log" for p in run_dir.iterdir()):
        shutil.rmtree(run_dir)
        for parent in list(run_dir.parents)[:keys.RUN_DIR_DEPTH - 1]:  # <pair>/<dataset>/<method>, if now empty
            try:
                parent.rmdir()
            except OSError:  # not empty (other runs), or not ours to remove
                break


def watch_interrupts() -> None:
    """Ctrl-C raises KeyboardInterrupt as usual and also sets `runner.INTERRUPT_REQUESTED`, so the
    run stops after the sample in flight even where the exception itself was dropped."""
    from rstitch import runner

    runner.INTERRUPT_REQUESTED.clear()
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread receives signals (and may set their handlers)

    def on_interrupt(signum, frame) -> None:
        runner.INTERRUPT_REQUESTED.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    install_sigterm_handler(on_interrupt)  # scancel, kill: the same stop (not a preempted Slurm job's)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def app(cfg: DictConfig) -> None:
    from rstitch.results.baseline import missing_baseline_note, planned_runs
    from rstitch.results.measurement import contention_notes
    from rstitch.results.summary import format_table, speedup_legend
    from rstitch.runner import evaluate

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    decoding_dir = run_dir  # where the samples of the run in flight go (the baseline's first, with baseline=auto)
    interrupted = False
    watch_interrupts()
    summaries: list[dict] = []
    try:
        resolved = resolved_run_config(cfg)
        logger = instantiate(resolved.pop("logger"))
        runs = planned_runs(resolved, resolved.pop("results_root"), run_dir)
        for planned in runs:
            decoding_dir = planned.run_dir
            summaries.append(evaluate(planned, logger=logger))
    except ConfigError as err:
        discard_if_empty(run_dir)
        fail(str(err))
    except KeyboardInterrupt:
        interrupted = True  # reported below, once the run's frames (and its progress bar) are gone
    if interrupted:
        discard_if_empty(run_dir)
        samples = decoding_dir / "samples.jsonl"
        saved = samples.read_bytes().count(b"\n") if samples.is_file() else 0  # a line cut by the interrupt is not a sample
        message = f"interrupted: {saved} samples saved in {decoding_dir}; rerun the same command to resume"
        print(f"\nrstitch-run: {message}", file=sys.stderr)
        exit_run(130, message)
    # Last on the console, after the loggers' output: the table, why a speedup is missing, where the results are.
    print(format_table(*summaries))
    for line in [*speedup_legend(*summaries), *contention_notes(summaries)]:
        print(line)
    note = missing_baseline_note(summaries[-1], HydraConfig.get().overrides.task)
    if note:
        print(note)
    print(f"results: {run_dir}")


def main() -> None:
    try:
        check_command_line(sys.argv[1:])
    except ConfigError as err:
        fail(str(err))
    with submitting(sys.argv[1:]):  # a submitit launcher's jobs: watched, cancelled on Ctrl-C, errors in one line
        app()


if __name__ == "__main__":
    main()
