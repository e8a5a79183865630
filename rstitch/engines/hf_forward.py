"""What the HF engine's eager path (engines/hf.py) and its static path (engines/hf_static.py) share."""
from __future__ import annotations

import functools
import heapq
import inspect
from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin

# A forward's fixed cost in padded tokens (testbed LLM on CPU: ~3 ms against ~0.1 ms per padded
# token): rows of very different widths (a catch-up prefill beside single-token steps) run as
# separate forwards when padding them together would cost more than that.
FORWARD_COST_TOKENS = 32


def compiled_path(compile_setting: Any, device: Any) -> str:
    """The decode path `engine.compile` selects on `device` (auto: graphs on CUDA, else "off"), for the
    engine and the run key alike."""
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


def forward_by_width(requests: list[Any], forward: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """`forward` over the requests' groups of similar widths (`width_groups`); outputs in request order."""
    outputs: list[Any] = [None] * len(requests)
    for group in width_groups([len(r.new_ids) for r in requests]):
        for i, out in zip(group, forward([requests[i] for i in group])):
            outputs[i] = out
    return outputs


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`cache` as the keyword `model`'s forward takes it: `cache` from transformers 5.24 on (where the old
    `past_key_values` warns), `past_key_values` before (the vLLM environment's 5.19-5.23) and in remote code."""
    # A class is hashable; torch's stubs declare Module.__hash__ in a form the Hashable protocol rejects.
    return {_cache_argument(type(model)): cache}  # type: ignore[arg-type]


@functools.cache
def _cache_argument(model_class: type[torch.nn.Module]) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


class ViewLayer(CacheLayerMixin):
    """One layer of the `Cache` one forward sees over a runner's own buffers: attention reads each row's
    first `read` positions (the 4D mask hides the rest); subclasses write the new keys in `update`."""

    def __init__(self, read: int):
        super().__init__()
        self.read, self.is_initialized = read, True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the runner sized its buffers for this forward."""

    def get_seq_length(self) -> int:
        return self.read  # the model is always given position ids, so it never offsets by this

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.read, 0

    def get_max_length(self) -> int:
        return self.read


def attention_mask(allowed: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """[rows, 1, width, read] from which keys each query may see: booleans, or additive for "eager"."""
    if implementation != "eager":
        return allowed[:, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


class KVBuffers:
    """Keys and values of many sequences, one slot (row) each: [slots, kv heads, length, head dim] per
    layer. Free slots are a heap: the lowest is taken first, which keeps forwards in few rows."""

    def __init__(self, config: Any, dtype: torch.dtype, device: torch.device, slots: int, length: int):
        self.n_layers, self.heads, self.head_dim = kv_shape(config)
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.free: list[int] = []
        self.peak_in_use = 0  # the most slots held at once
        self.reserve(slots, length)

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def acquire(self) -> int:
        if not self.free:
            self.reserve(2 * self.slots, self.length)
        slot = heapq.heappop(self.free)
        self.peak_in_use = max(self.peak_in_use, self.slots - len(self.free))
        return slot

    def release(self, slot: int) -> None:
        heapq.heappush(self.free, slot)

    def reserve(self, slots: int, length: int) -> None:
        """Grow to at least `slots` x `length` (new slots join the free ones)."""
        old = self.slots
        if slots > old or length > self.length:
            self.resize(max(slots, old), max(length, self.length))
            for slot in range(old, self.slots):
                heapq.heappush(self.free, slot)

    def make_room(self, length: int) -> None:
        """Slots of at least `length` positions: the length at least doubles when outgrown."""
        if length > self.length:
            self.reserve(self.slots, max(length, 2 * self.length))

    def resize(self, slots: int, length: int) -> None:
        """New zeroed buffers of `slots` x `length` holding what the old ones stored."""
        for store in (self.keys, self.values):
            for layer in range(self.n_layers):
                grown = torch.zeros((slots, self.heads, length, self.head_dim), dtype=self.dtype, device=self.device)
                if layer < len(store):
                    old = store[layer]
                    grown[: old.shape[0], :, : old.shape[2]] = old
                    store[layer] = grown
                else:
                    store.append(grown)


def attention_implementation(config: Any) -> str:
    """The attention a transformers config selects ("sdpa", "eager", ...)."""
    return config._attn_implementation  # transformers has no public getter; its models read this property


def kv_shape(config: Any) -> tuple[int, int, int]:
    """Layers, key/value heads and head size of a transformers config: the shape of its KV cache."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, heads, head_dim
