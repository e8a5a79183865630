"""GPU memory of a pair on vLLM: KV pools of equal token capacity for both models (`engine.kv_tokens`;
docs/vllm.md, Memory), checked before any model loads with one line when they do not fit.
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
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch_dtype(dtype).itemsize


def model_memory(name: str, config: Any, num_parameters: int, dtype: str) -> ModelMemory:
    return ModelMemory(name, num_parameters * torch_dtype(dtype).itemsize, kv_bytes_per_token(config, dtype))


def plan(gpu_bytes: int, models: list[ModelMemory], batch_size: int, max_len: int, utilization: float = 0.9,
         overhead_bytes: int = 2 * GIB) -> int:
    """The KV tokens each pool gets (equal): what `utilization` of the GPU leaves after the weights and
    `overhead_bytes` per engine; a `ConfigError` below `batch_size * max_len`."""
    fixed = sum(m.weight_bytes + overhead_bytes for m in models)
    per_token = sum(m.kv_bytes_per_token for m in models)
    tokens = max(int((utilization * gpu_bytes - fixed) // per_token), 0)
    needed = batch_size * max_len
    if tokens < needed:
        raise ConfigError(
            f"engine 'vllm': {' + '.join(m.name for m in models)} need {fixed / GIB:.1f} GiB (weights, "
            f"{overhead_bytes / GIB:.1f} GiB per engine) + {needed * per_token / GIB:.1f} GiB of KV for batch "
            f"{batch_size} x {max_len} tokens; {utilization:g} of the GPU's {gpu_bytes / GIB:.1f} GiB leaves room "
            f"for {tokens} tokens per pool")
    return tokens


def check_run(models: list[ModelMemory], batch_size: int, max_len: int, kv_tokens: int | None,
              gpu_bytes: int | None) -> int:
    """`batch_size` x `max_len` tokens in each pool (of `kv_tokens`, else planned on the GPU's free
    `gpu_bytes`); one line when they do not fit. Returns the capacity per pool."""
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
