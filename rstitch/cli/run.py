"""`rstitch-run`: the Hydra app rooted at conf/config.yaml."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rstitch.cli.preflight import check_command_line
from rstitch.configs import CONF_DIR
from rstitch.errors import ConfigError
from rstitch.results.keys import run_tag


def _testbed_asset(name: str) -> str:
    from rstitch.testbed import ASSETS_DIR

    return str(ASSETS_DIR / name)


def _run_tag(*, _root_: DictConfig) -> str:
    keys = ("pair", "engine", "dataset", "prompt", "max_new_tokens", "decoding", "n_samples", "method", "on_overflow", "batch_size")
    return run_tag({k: OmegaConf.to_container(_root_[k], resolve=True) if isinstance(_root_[k], DictConfig) else _root_.get(k)
                    for k in keys})


OmegaConf.register_new_resolver("testbed_asset", _testbed_asset, replace=True)
OmegaConf.register_new_resolver("run_tag", _run_tag, replace=True)


def compose_config(overrides: Sequence[str] = ()) -> dict:
    """The resolved run config for `overrides`, as `rstitch-run` would compose it (for scripts and
    notebooks: `runner.run_config(compose_config(["method=llm_only"]))`)."""
    from hydra import compose, initialize_config_dir

    check_group_choices(list(overrides))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return _run_config(cfg)


def _run_config(cfg: DictConfig) -> dict:
    """Resolved config minus the groups that only feed interpolations (experiment; prm, which
    the PRM-based methods read as method.prm and so is part of their run key)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict), "a DictConfig resolves to a dict"
    for key in ("experiment", "prm"):
        resolved.pop(key, None)
    return resolved


def fail(message: str) -> None:
    print(f"rstitch-run: error: {message}", file=sys.stderr)
    sys.exit(2)


RUN_DIR_DEPTH = 4  # <results_root>/<pair>/<dataset>/<method>/<tag>: the tag and three levels above it


def discard_if_empty(run_dir: Path) -> None:
    """A run that failed on bad input leaves no directory behind (Hydra creates it up front)."""
    if not run_dir.is_dir():
        return
    entries = list(run_dir.iterdir())
    if all(p.name in (".hydra", ".lock", "run_key.json") or p.suffix == ".log" for p in entries):
        shutil.rmtree(run_dir)
        for parent in list(run_dir.parents)[:RUN_DIR_DEPTH - 1]:  # <pair>/<dataset>/<method>, if now empty
            try:
                parent.rmdir()
            except OSError:  # not empty (other runs), or not ours to remove
                break


def saved_samples(run_dir: Path) -> int:
    """Finished samples in a run directory (a line cut by the interrupt is not one)."""
    path = run_dir / "samples.jsonl"
    if not path.is_file():
        return 0
    return path.read_bytes().count(b"\n")


def check_results_root(argv: list[str]) -> None:
    """Hydra creates the run directory before the run starts, and an unwritable results_root
    would end in its traceback: check the nearest existing ancestor first."""
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("results_root=")]
    root = given[-1] if given else "runs"  # the last override wins, as in Hydra
    existing = Path(root).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        fail(f"results_root '{root}' is not writable ({existing} is {'read-only' if existing.is_dir() else 'not a directory'})")
    try:  # permissions are not the whole story (root ignores them; /proc refuses new directories to everyone)
        os.rmdir(tempfile.mkdtemp(prefix=".rstitch-probe-", dir=existing))
    except OSError as err:
        fail(f"results_root '{root}' cannot be created: no new directory can be made in {existing} ({err.strerror})")


def check_group_choices(argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Catch `group=unknown` before Hydra does, with one line listing the valid choices."""
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.lstrip("+~").split("=", 1)
        if key not in groups or value in ("", "null"):
            continue
        valid = sorted(p.stem for p in (conf_dir / key).glob("*.yaml"))
        for choice in value.split(","):
            if choice not in valid:
                fail(f"unknown {key} '{choice}'; valid: {', '.join(valid)}")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def app(cfg: DictConfig) -> None:
    from rstitch.results.baseline import missing_baseline_note
    from rstitch.results.measurement import contention_notes
    from rstitch.results.summary import format_table
    from rstitch.runner import comparison_root, run, run_baseline

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    interrupted = False
    try:
        resolved = _run_config(cfg)
        logger = instantiate(resolved.pop("logger"))
        root = comparison_root(resolved.pop("results_root"), resolved)
        baseline = run_baseline(resolved, root, logger=logger)  # baseline=auto: run or resume it first
        summary = run(resolved, run_dir, logger=logger, results_root=root)
    except ConfigError as err:
        discard_if_empty(run_dir)
        fail(str(err))
    except KeyboardInterrupt:
        interrupted = True  # reported below, once the run's frames (and its progress bar) are gone
    if interrupted:
        discard_if_empty(run_dir)
        print(f"\nrstitch-run: interrupted: {saved_samples(run_dir)} samples saved in {run_dir}; "
              "rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    # Last on the console, after the loggers' output: the table, why a speedup is missing, where the results are.
    print(format_table(*filter(None, [baseline, summary])))
    for line in contention_notes(filter(None, [baseline, summary])):
        print(line)
    note = missing_baseline_note(summary, root, HydraConfig.get().overrides.task)
    if note:
        print(note)
    print(f"results: {run_dir}")


def main() -> None:
    check_group_choices(sys.argv[1:])
    check_results_root(sys.argv[1:])
    try:
        check_command_line(sys.argv[1:])
    except ConfigError as err:
        fail(str(err))
    app()


if __name__ == "__main__":
    main()
