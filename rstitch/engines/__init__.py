"""Engines: how a model is run. Methods see only `ModelRunner` / `Sequence` (engines/base.py)."""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

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
    check_hub_model,
    require,
    resolve_model_path,
)
from rstitch.engines.sampling import Sampler
from rstitch.errors import ConfigError
from rstitch.registry import Registry

# name -> "module:Class" in the package's one registry (rstitch/registry.py), imported lazily so an
# engine's heavy dependencies load only when used.
ENGINES: Registry[type[ModelRunner]] = Registry("engine")
ENGINES.register("hf", "rstitch.engines.hf:HFModelRunner")
ENGINES.register("vllm", "rstitch.engines.vllm:VLLMModelRunner")
ENGINES.register("llamacpp", "rstitch.engines.llamacpp:LlamaCppModelRunner")
ROLES = ("slm", "llm")
# Engines whose backend is an optional dependency: the package to import and how to install it.
OPTIONAL_BACKENDS = {"vllm": ("vllm", "pip install -e '.[vllm]' (docs/vllm.md)")}


def check_engine_installed(engine: str) -> None:
    """One line before any model loads, instead of an ImportError halfway through."""
    package, install = OPTIONAL_BACKENDS.get(engine, (None, None))
    if package is not None and importlib.util.find_spec(package) is None:
        raise ConfigError(f"engine '{engine}' needs the '{package}' package, which is not installed: {install}")


def load_model(engine: str, path: str, **options: Any) -> ModelRunner:
    """`engine`'s runner of the model at `path`; an unknown engine or option is one error line."""
    runner: ModelRunner = ENGINES.build(engine, path=path, **options)
    return runner


def load_scoring_model(engine: str, path: str, user: str, needs: tuple[str, ...] = (), **options: Any) -> ModelRunner:
    """One model outside a pair (a PRM, a judge, a router), loaded by `engine` after the same
    path checks as a pair's models; `needs` are the capabilities `user` reads, checked once here.
    On the HF engine a model that is not a causal LM keeping a KV cache (a bare backbone with a
    value head, a classifier, remote code without cache objects) runs the eager path whatever
    `compile` says: the static decoder (engines/hf_static.py) serves causal LMs with a cache only."""
    check_engine_installed(engine)
    if engine == "hf" and not _causal_lm_with_cache(options):
        options["compile"] = "off"
    runner = load_model(engine, **{**options, **_resolved({"path": path})})
    # Its forwards stay out of the scheduler's batches: a batched run's latency estimate is the pair's
    # fitted forwards plus each sample's own time, and a scorer's forwards are part of that own time.
    runner.joins_batches = False
    for capability in needs:
        require(runner, capability, user)
    return runner


def _causal_lm_with_cache(hf_options: dict[str, Any]) -> bool:
    from rstitch.engines.hf import CAUSAL_LM  # the HF engine loads next anyway

    return hf_options.get("auto_class", CAUSAL_LM) == CAUSAL_LM and hf_options.get("use_cache", True) is not False


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
    per_model = dict(shared.pop("per_model", None) or {})
    unknown = sorted(set(per_model) - set(ROLES))
    if unknown:
        raise ConfigError(f"engine.per_model has unknown model keys {unknown}; valid: {', '.join(ROLES)}")
    per_role = {role: dict(per_model.get(role) or {}) for role in ROLES}
    small = load_model(engine, **{**shared, **per_role["slm"], **slm})
    large = load_model(engine, **{**shared, **per_role["llm"], **llm})
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
    "Sequence", "SwitchRule", "TokenDistribution", "check_same_tokenizer", "load_model", "load_pair",
    "load_scoring_model", "require",
]
