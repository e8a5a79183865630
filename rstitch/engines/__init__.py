"""Engines: how a model is run. Methods see only `ModelRunner` / `Sequence` (engines/base.py)."""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from rstitch.configs import CONF_DIR
from rstitch.engines import packaged
from rstitch.engines.base import (
    Capabilities,
    CostCounter,
    EngineIdentity,
    Generation,
    ModelRunner,
    Sequence,
    SwitchRule,
    TokenDistribution,
    require,
    resolve_model_path,
)
from rstitch.engines.loading import model_specs
from rstitch.engines.sampling import Sampler
from rstitch.errors import ConfigError
from rstitch.hub import check_hub_model
from rstitch.registry import Registry

# One engine per config: conf/engine/<name>.yaml names the module rstitch/engines/<name>.py, whose
# `RUNNER` is the engine's class (docs/adding-an-engine.md). Imported lazily, at first use, so an
# engine's heavy dependencies load only when used.
ENGINES: Registry[type[ModelRunner]] = Registry("engine")
for _config in sorted((CONF_DIR / "engine").glob("*.yaml")):
    ENGINES.register(_config.stem, f"rstitch.engines.{_config.stem}:RUNNER")
ROLES = ("slm", "llm")


def engine_class(engine: str | None) -> type[ModelRunner]:
    """The registered class of `engine` (None: the default engine), to ask what it declares before
    any model loads; an unknown engine is one error line listing the valid ones."""
    return ENGINES.get_entry(engine or default_engine())


@functools.cache
def default_engine() -> str:
    """The engine a run uses when none is chosen: the one conf/config.yaml's defaults list selects."""
    config = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    assert isinstance(config, dict), "conf/config.yaml is a mapping"
    return next(str(entry["engine"]) for entry in config["defaults"] if isinstance(entry, Mapping) and "engine" in entry)


def engines_with(declaration: str) -> list[str]:
    """The engines (default first, then by name) whose class declares `declaration` true: a
    `Capabilities` field (`exact_distributions`) or a class flag (`checkpoint_heads`)."""
    first = default_engine()
    classes = {name: engine_class(name) for name in [first, *sorted(set(ENGINES) - {first})]}
    return [name for name, runner in classes.items()
            if getattr(runner.capabilities, declaration, None) or getattr(runner, declaration, False)]


def require_engine(engine: str | None, declaration: str, user: str) -> None:
    """One line when `engine`'s class (None: the default's) does not declare `declaration`
    (engines_with), naming those that do."""
    able, engine = engines_with(declaration), engine or default_engine()
    if engine not in able:
        raise ConfigError(f"{user}, which only engine {' or '.join(repr(a) for a in able)} loads; got engine '{engine}'")


def unnamed_profiles_engine() -> str:
    """The engine whose latency profiles carry no engine in their file name (saved before engines were named)."""
    return engines_with("unnamed_profiles")[0]


def judge_engine(engine: str) -> str:
    """The engine a judge scoring with the run's model runs on: the run's own when its class has
    exact full-vocabulary distributions (the judge reads any token's probability), else the first
    engine that has them."""
    if engine_class(engine).capabilities.exact_distributions:
        return engine
    return engines_with("exact_distributions")[0]


def check_engine_installed(engine: str) -> None:
    """One line before any model loads, instead of an ImportError halfway through."""
    engine_class(engine).check_installed(engine)


def load_model(engine: str, path: str, **options: Any) -> ModelRunner:
    """`engine`'s runner of the model at `path`; an unknown engine or option is one error line."""
    return ENGINES.build(engine, path=path, **options)


def load_scoring_model(engine: str | None, path: str, user: str, needs: tuple[str, ...] = (), **options: Any) -> ModelRunner:
    """One model outside a pair (a PRM, a judge, a router), loaded by `engine` after the same
    path checks and with the engine's own options for a scorer (`scoring_options`); `needs` are the
    capabilities `user` reads, checked once here. No `engine`: the run config's default."""
    engine = engine or default_engine()
    check_engine_installed(engine)
    options = engine_class(engine).scoring_options(options)
    runner = load_model(engine, **{**options, **_resolved({"path": path})})
    # Its forwards stay out of the scheduler's batches: a batched run's latency estimate is the pair's
    # fitted forwards plus each sample's own time, and a scorer's forwards are part of that own time.
    runner.joins_batches = False
    for capability in needs:
        require(runner, capability, user)
    return runner


@dataclass
class ModelPair:
    """The small (draft) and large (target) model of a hybrid decoder."""

    slm: ModelRunner
    llm: ModelRunner

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    def models(self) -> dict[str, ModelRunner]:
        return {"slm": self.slm, "llm": self.llm}


def load_pair(slm: dict, llm: dict, engine: str = "hf", **shared: Any) -> ModelPair:
    """Load both models (each a dict with `path` and optional `name`, per-model options).
    `shared` options apply to both, except `per_model: {slm: {...}, llm: {...}}`, whose entries
    (e.g. an engine's memory share of each model) apply to one of them."""
    check_engine_installed(engine)
    slm, llm = (_resolved(spec) for spec in (slm, llm))  # a bad path fails before either model loads
    specs = model_specs(dict(zip(ROLES, (slm, llm))), shared)
    small, large = (load_model(engine, **specs[role]) for role in ROLES)
    check_same_tokenizer(small, large)
    return ModelPair(small, large)


def _resolved(spec: dict) -> dict:
    if "path" not in spec:
        raise ConfigError(f"pair model {spec} has no path")
    if packaged.is_packaged(spec["path"]):  # each engine reads its own form of it (checkpoint or GGUF)
        packaged.check(spec["path"])
        return dict(spec)
    path = resolve_model_path(spec["path"], kind="gguf")  # a directory, or a GGUF file (engine=llamacpp)
    if not os.path.exists(path):
        check_hub_model(path, spec.get("revision"))
    return {**spec, "path": path}


def check_same_tokenizer(a: ModelRunner, b: ModelRunner) -> None:
    """Token ids must mean the same text in both models (added special tokens may differ)."""
    vocab_a, vocab_b = a.tokenizer.get_vocab(), b.tokenizer.get_vocab()
    differing = [t for t, i in vocab_a.items() if vocab_b.get(t, i) != i]
    if a.tokenizer.vocab_size != b.tokenizer.vocab_size or differing:
        example = f" (e.g. token {differing[0]!r})" if differing else ""
        raise ConfigError(
            f"tokenizer mismatch between SLM '{a.name}' and LLM '{b.name}': "
            f"base vocab {a.tokenizer.vocab_size} vs {b.tokenizer.vocab_size}, {len(differing)} tokens differ{example}"
        )


__all__ = [
    "ENGINES", "Capabilities", "CostCounter", "EngineIdentity", "Generation", "ModelPair", "ModelRunner", "Sampler",
    "Sequence", "SwitchRule", "TokenDistribution", "check_engine_installed", "check_same_tokenizer", "default_engine",
    "engine_class", "engines_with", "judge_engine", "load_model", "load_pair", "load_scoring_model", "require",
    "require_engine", "unnamed_profiles_engine",
]
