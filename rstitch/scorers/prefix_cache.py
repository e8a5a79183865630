"""Scoring rows through any engine, reusing the KV cache of the longest common prefix, so that a
scorer of a growing solution (a PRM, a judge, a router) pays each step's own tokens, not the whole
solution again (docs/reference.md "PRMs, judges and routers run on engines").
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rstitch.engines.base import ModelRunner, TokenDistribution, current_task
from rstitch.engines.base import Sequence as EngineSequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    return len(os.path.commonprefix([list(a), list(b)]))


def logit_rows(dists: list[TokenDistribution]) -> torch.Tensor:
    """The distributions' logits [n, V] (a classification model's on the HF `auto_class` path)."""
    return torch.stack([d.logits for d in dists])


@dataclass
class _Prefix:
    """One sample's sequence and the rows of its tokens so far."""

    seq: EngineSequence | None = None
    rows: torch.Tensor | None = None  # [len(seq), k] float32 (`rows`)
    last: torch.Tensor | None = None  # [k] float32: the last position's row (`last_row`)

    @property
    def ids(self) -> list[int]:
        return [] if self.seq is None else self.seq.tokens


class PrefixCachedScorer:
    """`read(distributions)` -> rows [n, k] for every position of `ids`, through `runner` (its counter
    books the cost). `use_cache=False` reruns everything (remote code whose forward takes no cache)."""

    def __init__(self, runner: ModelRunner, read: Callable[[list[TokenDistribution]], torch.Tensor] = logit_rows,
                 want_hidden: bool = False, use_cache: bool = True):
        self.runner, self.read, self.want_hidden, self.use_cache = runner, read, want_hidden, use_cache
        self._own = _Prefix()

    def _prefix(self, ids: Sequence[int]) -> tuple[list[int], _Prefix]:
        """`ids` and the previous call's state; in a batched run, the previous call of the same sample
        (the samples' calls interleave), so each sample reuses its own prefix as at batch size 1."""
        if not ids:
            raise ValueError("cannot score an empty input")
        task = current_task()
        return list(ids), self._own if task is None else task.local(self, _Prefix)

    def rows(self, ids: Sequence[int]) -> torch.Tensor:
        ids, prefix = self._prefix(ids)
        shared = common_prefix_length(prefix.ids, ids) if self.use_cache and prefix.rows is not None else 0
        if shared == len(ids):
            assert prefix.rows is not None, "a non-empty shared prefix has its rows"
            return prefix.rows[: len(ids)]
        seq = self._restart_from(prefix, shared)
        new_ids = ids[shared:]
        seq.append(new_ids[0])
        new_rows = self.read(seq.score(new_ids[1:])).float().reshape(len(new_ids), -1).cpu()
        prefix.rows = new_rows if prefix.rows is None else torch.cat([prefix.rows, new_rows])
        return prefix.rows

    def last_row(self, ids: Sequence[int]) -> torch.Tensor:
        """The row of the last position of `ids` alone (a judge's answer, a router's decision):
        one forward of the tokens after the shared prefix that keeps only the last position."""
        ids, prefix = self._prefix(ids)
        shared = common_prefix_length(prefix.ids, ids) if self.use_cache else 0
        if shared == len(ids) == len(prefix.ids) and prefix.last is not None:
            return prefix.last
        seq = self._restart_from(prefix, min(shared, len(ids) - 1))
        seq.append(ids[len(seq):])
        prefix.rows, prefix.last = None, self.read([seq.next_distribution()]).float().reshape(-1).cpu()
        return prefix.last

    def _restart_from(self, prefix: _Prefix, shared: int) -> EngineSequence:
        """The sample's sequence cut back to its first `shared` tokens (a new one for none)."""
        prefix.last = None
        if shared == 0 or prefix.seq is None:
            prefix.seq, prefix.rows = self.runner.new_sequence([], want_hidden=self.want_hidden), None
        else:
            prefix.seq.rollback(len(prefix.seq) - shared)
            prefix.rows = None if prefix.rows is None else prefix.rows[:shared]
        return prefix.seq
