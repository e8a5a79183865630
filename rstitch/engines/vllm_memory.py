"""GPU memory of a pair on vLLM: KV pools of equal token capacity for both models.

Each model is its own vLLM engine with its own KV pool. Fractions of GPU memory
(`gpu_memory_utilization`) give pools whose token capacities differ by the models' KV bytes per
token, so under batch load the smaller pool fills and evicts first. A run instead asks for a
capacity in tokens, the same for both (`engine.kv_tokens`: each model's `kv_cache_memory_bytes`
is that many tokens of its KV), at least the run's batch times its sequence length; `plan`
checks that the weights and both pools fit, with one line when they do not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rstitch.engines.base import torch_dtype
from rstitch.errors import ConfigError

GIB = 1 << 30


@dataclass(frozen=True)
class ModelMemory:
    """What one model needs: its weights, and KV bytes per token of context."""

    name: str
    weight_bytes: int
    kv_bytes_per_token: int


def kv_bytes_per_token(config: Any, dtype: str) -> int:
    """Keys and values of every layer for one token (grouped-query heads counted once per group)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes(dtype)


def model_memory(name: str, config: Any, num_parameters: int, dtype: str) -> ModelMemory:
    return ModelMemory(name, num_parameters * dtype_bytes(dtype), kv_bytes_per_token(config, dtype))


def dtype_bytes(dtype: str) -> int:
    return torch_dtype(dtype).itemsize


def plan(gpu_bytes: int, models: list[ModelMemory], batch_size: int, max_len: int, utilization: float = 0.9,
         overhead_bytes: int = 2 * GIB) -> int:
    """The KV capacity in tokens each pool gets: all that `utilization` of the GPU leaves after the
    weights and `overhead_bytes` per engine (activations, CUDA graphs), split so that both pools
    hold the same number of tokens. A `ConfigError` when that is below `batch_size * max_len`."""
    budget = utilization * gpu_bytes - sum(m.weight_bytes + overhead_bytes for m in models)
    per_token = sum(m.kv_bytes_per_token for m in models)
    tokens = int(budget // per_token) if budget > 0 else 0
    needed = batch_size * max_len
    if tokens < needed:
        fixed = sum(m.weight_bytes + overhead_bytes for m in models)
        raise ConfigError(
            f"engine 'vllm': {' + '.join(m.name for m in models)} need {fixed / GIB:.1f} GiB (weights, "
            f"{overhead_bytes / GIB:.1f} GiB per engine) + {needed * per_token / GIB:.1f} GiB of KV for batch "
            f"{batch_size} x {max_len} tokens; {utilization:g} of the GPU's {gpu_bytes / GIB:.1f} GiB leaves room "
            f"for {tokens} tokens per pool")
    return tokens


def check_run(models: list[ModelMemory], batch_size: int, max_len: int, kv_tokens: int | None,
              gpu_bytes: int | None) -> int:
    """A run's KV need against its pools, before any model loads: `batch_size` sequences of
    `max_len` tokens in each pool. `kv_tokens` set: one line when it holds fewer, and on a GPU
    (`gpu_bytes` free) when both pools of that size and the weights do not fit. Returns the
    capacity per pool: `kv_tokens`, else what `plan` gives on the GPU, else the need itself."""
    needed = batch_size * max_len
    if kv_tokens is not None and kv_tokens < needed:
        raise ConfigError(f"engine.kv_tokens={kv_tokens} holds fewer tokens than batch {batch_size} x {max_len} "
                          f"({needed}) per model; raise engine.kv_tokens or lower batch_size or the token budget")
    if gpu_bytes is None:
        return kv_tokens if kv_tokens is not None else needed
    if kv_tokens is not None:
        plan(gpu_bytes, models, 1, kv_tokens)
        return kv_tokens
    return plan(gpu_bytes, models, batch_size, max_len)
