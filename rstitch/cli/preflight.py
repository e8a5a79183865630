"""Checks of an `rstitch-run` command line before Hydra sees it: what Hydra or a launcher would report in many
lines, or silently do, becomes one `ConfigError` line before any run directory exists."""
from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rstitch.config_groups import check_group_choices
from rstitch.configs import CONF_DIR, override_key, override_value
from rstitch.errors import ConfigError

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

MULTIRUN_FLAGS = ("-m", "--multirun")
SLURM_COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")


def check_results_root(argv: Sequence[str]) -> None:
    """Hydra creates the run directory before the run starts, and an unwritable results_root
    would end in its traceback: check the nearest existing ancestor first."""
    root = override_value(argv, "results_root") or "runs"
    existing = Path(root).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"results_root '{root}' is not writable ({existing} is {'read-only' if existing.is_dir() else 'not a directory'})")
    try:  # permissions are not the whole story (root ignores them; /proc refuses new directories to everyone)
        os.rmdir(tempfile.mkdtemp(prefix=".rstitch-probe-", dir=existing))
    except OSError as err:
        raise ConfigError(f"results_root '{root}' cannot be created: no new directory can be made in {existing} ({err.strerror})") from None


def parsed_overrides(overrides: Sequence[str]) -> list[Override]:
    """The overrides parsed by Hydra's own grammar; one that does not parse is one line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as err:
        raise ConfigError(f"cannot parse the overrides {' '.join(overrides)}: {composition_error(str(err))}") from None


def check_sweep_needs_multirun(overrides: Sequence[str], multirun: bool) -> None:
    """`method.tau=0.01,0.02` without -m: Hydra's five-line "Ambiguous value" message."""
    if multirun:
        return
    for override, parsed in zip(overrides, parsed_overrides(overrides)):
        if parsed.is_sweep_override():
            raise ConfigError(f"'{override}' is a sweep: add -m to run one run per value (rstitch-run -m ... {override}); "
                              "a list is key=[a,b], a text with a comma key='a,b'")


def check_slurm(overrides: Sequence[str]) -> None:
    """A Slurm launcher without Slurm (submitit's traceback) or with requests no node meets (pending forever)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rstitch.cli.cluster import SLURM_LAUNCHERS, check_requests

    launcher = override_value(overrides, "hydra/launcher")
    if launcher not in SLURM_LAUNCHERS:
        return
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if missing:
        raise ConfigError(f"hydra/launcher={launcher} submits Slurm jobs, and this machine has no {' or '.join(missing)} on PATH; "
                          "run it on a Slurm login node, or use hydra/launcher=local (parallel processes here) "
                          "or no launcher (one run after another)")
    hydra_overrides = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):  # `hydra.launcher` as the command line composes it
        cfg = compose(config_name="config", overrides=hydra_overrides, return_hydra_config=True)
    check_requests(cast(dict, OmegaConf.to_container(cfg.hydra.launcher, resolve=False)))  # a launcher's config is a mapping


def grid_points(sweeper_params: dict | None) -> int:
    """How many runs a preset's `hydra.sweeper.params` stands for."""
    parsed = parsed_overrides([f"{k}={v}" for k, v in (sweeper_params or {}).items()])
    return math.prod(len(list(o.sweep_iterator())) if o.is_sweep_override() else 1 for o in parsed)


def check_composes(overrides: Sequence[str], multirun: bool) -> None:
    """Compose every point as Hydra will and check what its job would find wrong (a misspelt key, a shard index
    out of range, a bad `baseline`) before anything runs; a grid preset without -m (one point, silently) is refused."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rstitch.logging.sweep import sweep_points

    run_overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    first = sweep_points(run_overrides)[0]  # the first point: the preset it names (and its grid)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=first, return_hydra_config=True)
            params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.get("params") else None
            given = {override_key(o) for o in overrides}
            swept = {k: v for k, v in (params if isinstance(params, dict) else {}).items() if k not in given}
            if not multirun and grid_points(swept) > 1:
                preset = cfg.hydra.runtime.choices.get("experiment") or "the composed config"
                raise ConfigError(f"experiment '{preset}' is a grid of {grid_points(swept)} runs (hydra.sweeper.params: "
                                  f"{', '.join(map(str, swept))}); run it with -m (rstitch-run -m experiment={preset}), "
                                  "or give each of those keys one value")
            points = sweep_points(run_overrides, swept) if multirun else [run_overrides]
            for point in points:
                check_point(point, len(points) > 1)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(str(err))) from None


def check_point(point: Sequence[str], name_it: bool) -> None:
    """One point composed and checked as its run starts (before the models load)."""
    from hydra import compose

    from rstitch.config_groups import resolved_run_config
    from rstitch.data import load_dataset_records
    from rstitch.results.baseline import wants_baseline_run

    try:
        cfg = resolved_run_config(compose(config_name="config", overrides=list(point)))
        wants_baseline_run(cfg)
        dataset = cfg.get("dataset") or {}
        if (dataset.get("shard"), dataset.get("num_shards")) not in ((None, None), (0, 1), (None, 1), (0, None)):
            load_dataset_records(**dataset)  # the shard index and count against the selection
    except ConfigError as err:
        raise ConfigError(f"sweep point {' '.join(point)}: {err}" if name_it else str(err)) from None


def composition_error(message: str) -> str:
    """Hydra's composition error as one line."""
    unknown = re.match(r"Could not override '([^']+)'", message)
    if unknown:
        key = unknown.group(1)
        return f"unknown key '{key}': no such setting in the composed config (check its spelling; +{key}=... adds a new key)"
    return " ".join(line.strip() for line in message.strip().splitlines() if line.strip())


def check_command_line(argv: Sequence[str]) -> None:
    """Every check above, on `rstitch-run`'s arguments (`group=unknown` with one line listing the valid choices)."""
    check_group_choices(list(argv))
    check_results_root(argv)
    if any(a.startswith("-") and a not in MULTIRUN_FLAGS for a in argv):
        return  # a Hydra flag other than -m (`--cfg`, ...): the overrides are Hydra's to report
    overrides = [a for a in argv if "=" in a]
    multirun = any(a in MULTIRUN_FLAGS for a in argv)
    check_sweep_needs_multirun(overrides, multirun)
    check_slurm(overrides)
    check_composes(overrides, multirun)
