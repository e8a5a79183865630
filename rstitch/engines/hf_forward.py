"""What the HF engine's eager path (engines/hf.py) and its static path (engines/hf_static.py) both
use to run a transformers model: the decode path `engine.compile` selects, the KV-cache keyword its
forward takes, and how rows of different widths are grouped into padded forwards."""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

# A forward's fixed cost in padded tokens (testbed LLM on CPU: ~3 ms against ~0.1 ms per padded
# token): rows of very different widths (a catch-up prefill beside single-token steps) run as
# separate forwards when padding them together would cost more than that.
FORWARD_COST_TOKENS = 32


def compiled_path(compile_setting: Any, device: Any) -> str:
    """The decode path that `engine.compile` selects on `device` (docs/gpu.md): auto is graphs on
    CUDA and the eager path ("off") elsewhere. The engine (hf_static.resolve_mode) and the run key
    (HFModelRunner.decode_path_key) read the one rule."""
    if compile_setting is True:
        return "graphs"
    if compile_setting in (False, None, "off"):
        return "off"
    if compile_setting == "auto":
        return "graphs" if str(device).startswith("cuda") else "off"
    return str(compile_setting)

def width_groups(widths: list[int]) -> list[list[int]]:
    """Rows (by index) split into padded forwards of similar widths, minimizing the sum over
    forwards of FORWARD_COST_TOKENS + rows x widest row (exact, over the rows sorted by width)."""
    order = sorted(range(len(widths)), key=lambda i: widths[i])
    best = [0.0] + [float("inf")] * len(order)  # best[j]: cost of the first j sorted rows
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            cost = best[i] + FORWARD_COST_TOKENS + (j - i) * widths[order[j - 1]]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return groups[::-1]


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`cache` as the keyword `model`'s forward takes it: `cache` from transformers 5.24 on (the
    old `past_key_values` warns at every call there and goes in 5.40), `past_key_values` before
    (5.19-5.23: the vLLM engine's environment) and in remote-code models."""
    # A class is hashable; torch's stubs declare Module.__hash__ in a form the Hashable protocol rejects.
    return {_cache_argument(type(model)): cache}  # type: ignore[arg-type]


@functools.cache
def _cache_argument(model_class: type[torch.nn.Module]) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def kv_shape(config: Any) -> tuple[int, int, int]:
    """Layers, key/value heads and head size of a transformers config: the shape of its KV cache."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, heads, head_dim
