"""What every engine reads from a checkpoint besides its weights, with one error line for a missing model."""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rstitch.errors import ConfigError


@contextmanager
def model_load_errors(path: str) -> Iterator[None]:
    """A hub id unreachable offline, or a directory without a model: one `ConfigError` line."""
    try:
        yield
    except OSError as err:
        raise ConfigError(f"cannot load model '{path}': {str(err).splitlines()[0]}") from None


def model_specs(models: Mapping[str, Mapping[str, Any]], shared: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each model's options: `shared` ones, then its `per_model` entry (e.g. an engine's memory share
    of each model), then its own spec (`models[role]`: path, name...), later ones winning."""
    shared = dict(shared)
    per_model = dict(shared.pop("per_model", None) or {})
    unknown = sorted(set(per_model) - set(models))
    if unknown:
        raise ConfigError(f"engine.per_model has unknown model keys {unknown}; valid: {', '.join(models)}")
    return {role: {**shared, **(per_model.get(role) or {}), **spec} for role, spec in models.items()}


def run_model_specs(pair_cfg: Mapping[str, Any], engine_cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`model_specs` of a run config's `pair` and `engine` groups: the pair's dtype and device and the
    engine's options (its name aside) are shared."""
    shared = {"dtype": pair_cfg.get("dtype", "float32"), "device": pair_cfg.get("device", "cpu"),
              **{k: v for k, v in engine_cfg.items() if k != "name"}}
    return model_specs({role: pair_cfg[role] for role in ("slm", "llm")}, shared)


def load_tokenizer(path: str, tokenizer: Any = None, **options: Any) -> Any:
    """`tokenizer` if one is given, else the checkpoint's (None options left out)."""
    if tokenizer is not None:
        return tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, **{k: v for k, v in options.items() if v is not None})


def load_config(path: str, **options: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, **{k: v for k, v in options.items() if v is not None})


def generation_eos(path: str, **options: Any) -> int | list[int] | None:
    """The EOS ids of the checkpoint's generation_config.json (None without one)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path, **{k: v for k, v in options.items() if v is not None}).eos_token_id
    except OSError:
        return None


def eos_token_ids(tokenizer: Any, *sources: int | Iterable[int] | None) -> list[int]:
    """The tokenizer's EOS id and every id of `sources` (ints, lists or None), sorted."""
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, *sources):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return sorted(ids)


def shared_vocab_size(tokenizer: Any, model_vocab_size: int) -> int:
    """The vocabulary logits are cut to: one family's checkpoints pad their embeddings differently."""
    return min(len(tokenizer), model_vocab_size)


def model_name(path: str, name: str | None) -> str:
    return name or os.path.basename(path.rstrip("/"))


def count_parameters(config: Any) -> int:
    """The parameter count of `config`'s causal LM, from a weightless (meta-device) instance."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
