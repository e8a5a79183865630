"""One entry of a config group (a pair, a prompt format), read as `rstitch-run` composes it: for
scripts that load a pair or render prompts outside a run."""
from __future__ import annotations

from typing import Any

from rstitch.configs import CONF_DIR
from rstitch.data.prompts import PromptFormat
from rstitch.errors import ConfigError


def group_choices(group: str) -> list[str]:
    """The names `group=<name>` accepts (conf/<group>/*.yaml), e.g. for argparse `choices`."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def group_config(group: str, name: str) -> dict[str, Any]:
    """conf/<group>/<name>.yaml composed and resolved (e.g. testbed asset paths) as in a run."""
    from rstitch.cli.run import compose_config

    valid = group_choices(group)
    if name not in valid:
        raise ConfigError(f"unknown {group} '{name}'; valid: {', '.join(valid)}")
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
