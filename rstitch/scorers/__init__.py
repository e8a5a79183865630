"""Models that score steps: process reward models (`load_prm(name, **options)`, configs in conf/prm/),
the LLM judge, the Arbitrage and R-Stitch+ routers, and the prefix cache they score through."""
from __future__ import annotations

import json
from typing import Any

from rstitch.errors import ConfigError
from rstitch.registry import Registry
from rstitch.scorers.prm import ProcessRewardModel

# name -> "module:Class"; imported lazily so a PRM's dependencies load only when used.
PRMS: Registry[type[ProcessRewardModel]] = Registry("PRM")
for _name, _entry in {
    "testbed": "rstitch.scorers.likelihood_prm:TestbedPRM",
    "oracle": "rstitch.scorers.oracle:OracleStepChecker",
    "skywork": "rstitch.scorers.hf_prm:SkyworkPRM",
    "qwen_math_prm": "rstitch.scorers.hf_prm:QwenMathPRM",
    "llm_judge": "rstitch.scorers.judge_prm:LLMJudgePRM",
}.items():
    PRMS.register(_name, _entry)
_LOADED: dict[str, ProcessRewardModel] = {}  # reused across the jobs of a sweep, like model pairs


def load_prm(name: str, **options: Any) -> ProcessRewardModel:
    """The PRM `name` with its options checked against its constructor (one error line)."""
    return PRMS.build(name, **options)


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
    PRMS.canonical(spec["name"])  # an unknown name: one error line listing the valid ones
    return dict(spec)


__all__ = ["PRMS", "ProcessRewardModel", "check_prm_spec", "load_prm", "resolve_prm"]
