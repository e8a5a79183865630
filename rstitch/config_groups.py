"""The run config as `rstitch-run` composes it (`compose_config`, the group-choice check, the
`testbed_asset` resolver), and one entry of a config group (a pair, a prompt format) read that way:
for the CLI, scripts, notebooks and training jobs, which all sit above this module."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rstitch.configs import CONF_DIR
from rstitch.data.prompts import PromptFormat
from rstitch.errors import ConfigError
from rstitch.testbed import ASSETS_DIR

OmegaConf.register_new_resolver("testbed_asset", lambda name: str(ASSETS_DIR / name), replace=True)


def _judge_engine(engine: str) -> str:
    """The engine a stand-in judge (`prm=llm_judge`, the pair's LLM) runs on (engines.judge_engine): the run's
    own where it gives full-vocabulary distributions, to score with the weights the run decodes with, billed at
    their speed. Setting `prm.engine` to the run's engine keeps it there (vLLM with `engine.logprobs=full`)."""
    from rstitch.engines import judge_engine  # the engine classes (torch): only when a judge's config resolves

    return judge_engine(engine)


OmegaConf.register_new_resolver("judge_engine", _judge_engine, replace=True)

# Groups that only feed interpolations: experiment (presets), prm (the PRM-based methods read it as
# method.prm, and so it is part of their run key).
INTERPOLATION_GROUPS = ("experiment", "prm")


def compose_config(overrides: Sequence[str] = ()) -> dict:
    """The resolved run config for `overrides`, as `rstitch-run` would compose it (for scripts and
    notebooks: `runner.run_config(compose_config(["method=llm_only"]))`); an unknown group choice
    is a ConfigError listing the valid ones."""
    from hydra import compose, initialize_config_dir

    check_group_choices(list(overrides))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return resolved_run_config(cfg)


def resolved_run_config(cfg: DictConfig) -> dict:
    """Resolved config minus the groups that only feed interpolations."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict), "a DictConfig resolves to a dict"
    for key in INTERPOLATION_GROUPS:
        resolved.pop(key, None)
    return resolved


def check_group_choices(argv: list[str]) -> None:
    """Catch `group=unknown` before Hydra does: a ConfigError listing the valid choices."""
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.lstrip("+~").split("=", 1)
        if key not in groups or value in ("", "null"):
            continue
        valid = group_choices(key)
        for choice in value.split(","):
            if choice not in valid:
                raise ConfigError(f"unknown {key} '{choice}'; valid: {', '.join(valid)}")


def group_choices(group: str) -> list[str]:
    """The names `group=<name>` accepts (conf/<group>/*.yaml), e.g. for argparse `choices`."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def group_config(group: str, name: str) -> dict[str, Any]:
    """conf/<group>/<name>.yaml composed and resolved (e.g. testbed asset paths) as in a run; an unknown name is
    compose_config's error line."""
    return compose_config(["logger=none", f"{group}={name}"])[group]


def pair_config(name: str, slm: str | None = None, llm: str | None = None) -> dict[str, Any]:
    """conf/pair/<name>.yaml, with the SLM's or LLM's path replaced where one is given."""
    config = group_config("pair", name)
    for role, path in (("slm", slm), ("llm", llm)):
        if path:
            config[role] = {**config[role], "path": path}
    return config


def prompt_format(name: str) -> PromptFormat:
    """conf/prompt/<name>.yaml as the `PromptFormat` a run renders prompts with."""
    return PromptFormat(**group_config("prompt", name))
