"""Checks of an `rstitch-run` command line before Hydra sees it: what Hydra (or a launcher) would
report as a multi-line error or a traceback, or silently do otherwise, becomes one `ConfigError`
line (`rstitch-run: error: ...`, exit 2), before any run directory exists."""
from __future__ import annotations

import math
import re
import shutil
from collections.abc import Sequence

from rstitch.configs import CONF_DIR
from rstitch.errors import ConfigError

MULTIRUN_FLAGS = ("-m", "--multirun")
# Hydra's sweep functions: a value calling one of these is a sweep, as a comma list is.
SWEEP_FUNCTIONS = re.compile(r"^(range|choice|glob|interval|tag|sort|shuffle)\(")
SLURM_COMMANDS = ("sbatch", "srun")


def is_multirun(argv: Sequence[str]) -> bool:
    return any(a in MULTIRUN_FLAGS for a in argv)


def overrides_of(argv: Sequence[str]) -> list[str] | None:
    """The `key=value` overrides of the command line, or None when it holds a Hydra flag other
    than -m (`--cfg`, `--config-dir`, ...), whose meaning these checks leave to Hydra."""
    if any(a.startswith("-") and a not in MULTIRUN_FLAGS for a in argv):
        return None
    return [a for a in argv if "=" in a]


def top_level_items(value: str) -> list[str]:
    """`value` split at the commas outside brackets, braces, parentheses and quotes."""
    items, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(value):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    return [*items, value[start:]]


def is_sweep(value: str) -> bool:
    return len(top_level_items(value)) > 1 or bool(SWEEP_FUNCTIONS.match(value.strip()))


def check_sweep_needs_multirun(overrides: Sequence[str], multirun: bool) -> None:
    """`method.tau=0.01,0.02` without -m: Hydra's five-line "Ambiguous value" message."""
    if multirun:
        return
    for override in overrides:
        if is_sweep(override.split("=", 1)[1]):
            raise ConfigError(f"'{override}' is a sweep: add -m to run one run per value (rstitch-run -m ... {override}); "
                              "a list is key=[a,b], a text with a comma key='a,b'")


def check_slurm(overrides: Sequence[str]) -> None:
    """`hydra/launcher=slurm` on a machine without Slurm: submitit's traceback after composing."""
    if not any(o.lstrip("+").split("=", 1) == ["hydra/launcher", "slurm"] for o in overrides):
        return
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if missing:
        raise ConfigError(f"hydra/launcher=slurm submits Slurm jobs, and this machine has no {' or '.join(missing)} on PATH; "
                          "run it on a Slurm login node, or use hydra/launcher=local (parallel processes here) "
                          "or no launcher (one run after another)")


def first_values(overrides: Sequence[str]) -> list[str] | None:
    """Each sweep override reduced to its first value (one point to compose), or None when a
    sweep function makes the points unknown here."""
    out = []
    for override in overrides:
        key, value = override.split("=", 1)
        if SWEEP_FUNCTIONS.match(value.strip()):
            return None
        out.append(f"{key}={top_level_items(value)[0]}")
    return out


def grid_points(sweeper_params: dict | None) -> int:
    """How many runs a preset's `hydra.sweeper.params` stands for."""
    return math.prod(len(top_level_items(str(v))) for v in (sweeper_params or {}).values())


def check_composes(overrides: Sequence[str], multirun: bool) -> None:
    """Compose one point of the command as Hydra will: a misspelt key is one line (not Hydra's
    multi-line message), and a grid preset (`experiment=...` with sweeper params) run without -m,
    which would silently run a single point, is refused."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    point = first_values([o for o in overrides if not o.lstrip("+~").startswith("hydra")])
    if point is None:
        return
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=point, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(str(err))) from None
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.get("params") else None
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    swept = {k: v for k, v in (params if isinstance(params, dict) else {}).items() if k not in given}
    points = grid_points(swept)
    if not multirun and points > 1:
        preset = cfg.hydra.runtime.choices.get("experiment") or "the composed config"
        raise ConfigError(f"experiment '{preset}' is a grid of {points} runs (hydra.sweeper.params: {', '.join(map(str, swept))}); "
                          f"run it with -m (rstitch-run -m experiment={preset}), or give each of those keys one value")


def composition_error(message: str) -> str:
    """Hydra's composition error as one line."""
    unknown = re.match(r"Could not override '([^']+)'", message)
    if unknown:
        key = unknown.group(1)
        return f"unknown key '{key}': no such setting in the composed config (check its spelling; +{key}=... adds a new key)"
    return " ".join(line.strip() for line in message.strip().splitlines() if line.strip())


def check_command_line(argv: Sequence[str]) -> None:
    """Every check above, on `rstitch-run`'s arguments."""
    overrides = overrides_of(argv)
    if overrides is None:
        return
    multirun = is_multirun(argv)
    check_sweep_needs_multirun(overrides, multirun)
    check_slurm(overrides)
    check_composes(overrides, multirun)
