"""Scoring heads over a transformer backbone that reuse the KV cache of the longest common prefix.

Step-level methods score a growing solution: each call repeats the problem and the earlier steps.
Like the engines' partial prefill, only the tokens after the prefix shared with the previous call
run through the backbone, so a step costs its own tokens, not the whole solution again.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rstitch.engines import CostCounter
from rstitch.engines.hf import cache_kwargs


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class _Prefix:
    """The previous call's ids, their rows and the backbone's KV cache."""

    ids: list[int]
    rows: torch.Tensor | None = None  # [len(ids), k] float32
    cache: Any = None


class PrefixCachedHead:
    """`head(backbone(ids).last_hidden_state)` for every position of `ids`, one row per token.

    Rows of positions shared with the previous call are kept; the cache is cropped to the shared
    prefix and only the rest runs. `use_cache=False` reruns everything (for remote-code models
    whose forward does not accept a cache object)."""

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Module, cost: CostCounter, use_cache: bool = True):
        self.backbone, self.head, self.cost, self.use_cache = backbone, head, cost, use_cache
        self.device = next(backbone.parameters()).device
        self._own = _Prefix([])

    @property
    def _prefix(self) -> _Prefix:
        """The previous call's state; in a batched run, the previous call of the same sample (the
        samples' calls interleave), so each sample reuses its own prefix as at batch size 1."""
        from rstitch.engines.batching import current_task

        task = current_task()
        return self._own if task is None else task.local(self, lambda: _Prefix([]))

    @torch.inference_mode()
    def rows(self, ids: Sequence[int]) -> torch.Tensor:
        ids = list(ids)
        if not ids:
            raise ValueError("cannot score an empty input")
        prefix = self._prefix
        shared = common_prefix_length(prefix.ids, ids) if self.use_cache else 0
        if shared == len(ids):
            assert prefix.rows is not None, "a non-empty shared prefix has its rows"
            return prefix.rows[: len(ids)]
        self._restart_from(prefix, shared)
        new_rows = self._run(prefix, ids[shared:])
        prefix.ids = ids
        prefix.rows = new_rows if prefix.rows is None else torch.cat([prefix.rows, new_rows])
        return prefix.rows

    def _restart_from(self, prefix: _Prefix, shared: int) -> None:
        if shared == 0 or prefix.cache is None:
            from transformers import DynamicCache

            # A transformers backbone: torch's Module.__getattr__ types its config as Tensor | Module.
            prefix.cache = DynamicCache(config=self.backbone.config) if self.use_cache else None  # type: ignore[arg-type]
            prefix.rows, shared = None, 0
        else:
            excess = prefix.cache.get_seq_length() - shared
            if excess > 0:
                prefix.cache.crop(-excess)  # a negative count removes that many positions
            assert prefix.rows is not None, "a non-empty shared prefix has its rows"
            prefix.rows = prefix.rows[:shared]
        prefix.ids = prefix.ids[:shared]

    def _run(self, prefix: _Prefix, new_ids: list[int]) -> torch.Tensor:
        start = time.perf_counter()
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=self.device)
        out = self.backbone(input_ids=input_ids, use_cache=self.use_cache, **cache_kwargs(self.backbone, prefix.cache))
        hidden = out.last_hidden_state[0]
        rows = self.head(hidden.to(_param_dtype(self.head))).float().reshape(len(new_ids), -1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.cost.add_forward(len(new_ids), time.perf_counter() - start)
        return rows.cpu()


def _param_dtype(module: torch.nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype
