"""Process reward models: `load_prm(name, **options)` (configs in conf/prm/)."""
from __future__ import annotations

import importlib
import json
from typing import Any

from rstitch.errors import ConfigError
from rstitch.rewards.base import ProcessRewardModel

# name -> "module:Class"; imported lazily so a PRM's dependencies load only when used.
PRMS = {
    "testbed": "rstitch.rewards.likelihood_prm:TestbedPRM",
    "oracle": "rstitch.rewards.oracle:OracleStepChecker",
    "skywork": "rstitch.rewards.hf_prm:SkyworkPRM",
    "qwen_math_prm": "rstitch.rewards.hf_prm:QwenMathPRM",
    "llm_judge": "rstitch.rewards.judge_prm:LLMJudgePRM",
}
_LOADED: dict[str, ProcessRewardModel] = {}  # reused across the jobs of a sweep, like model pairs


def check_prm_name(name: Any) -> str:
    if name not in PRMS:
        raise ConfigError(f"unknown PRM '{name}'; valid: {', '.join(sorted(PRMS))}")
    return name


def load_prm(name: str, **options: Any) -> ProcessRewardModel:
    from rstitch.methods.base import check_parameters  # lazy: the methods import this package

    module, cls_name = PRMS[check_prm_name(name)].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        check_parameters(cls, options)
    except TypeError as err:
        raise ConfigError(f"PRM '{name}': {err}") from None
    return cls(**options)  # a TypeError raised in here is a bug of the PRM: it propagates as one


def resolve_prm(spec: ProcessRewardModel | dict[str, Any]) -> ProcessRewardModel:
    """A PRM object as is, or a config dict ({name: ..., options...}) loaded once per process."""
    if isinstance(spec, ProcessRewardModel):
        return spec
    key = json.dumps(spec, sort_keys=True, default=str)
    if key not in _LOADED:
        options = dict(spec)
        _LOADED[key] = load_prm(options.pop("name"), **options)
    return _LOADED[key]


def check_prm_spec(spec: Any, owner: str) -> ProcessRewardModel | dict[str, Any]:
    """Validate a method's `prm` parameter without loading the model."""
    if isinstance(spec, ProcessRewardModel):
        return spec
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"method.prm of '{owner}' must be a mapping with a 'name', got {spec!r}")
    check_prm_name(spec["name"])
    return dict(spec)


__all__ = ["PRMS", "ProcessRewardModel", "check_prm_spec", "load_prm", "resolve_prm"]
