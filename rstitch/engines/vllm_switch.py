"""A vLLM logits processor that ends a request at the first token crossing a `SwitchRule`.

It computes the exact normalized entropy of every step over the shared vocabulary (the raw
logits, before temperature, as `TokenDistribution.normalized_entropy` does on the HF engine),
so a token-level hybrid's run of tokens on one model is one request, not one per token. A
request takes part through `SamplingParams.extra_args[KEY]`:

    {"tag": unique id, "vocab": V, "sentinel": S, "tau": float | None, "stop_above": bool, "keep_last": bool}

At every step the logits beyond V are masked (the HF engine cuts them off), and:

* drop rule (`keep_last` false): at the first step that crosses, the row is forced to the
  sentinel token S, which the request lists as a stop token: the request ends there and the
  caller drops S (the crossing position is left to the other model);
* keep rule: the crossing step samples as usual and the *next* step is forced to S.

`forced(tag)` says at which output index S was forced, so an S the model sampled by itself is
told apart from a forced one (on vocabularies without padding ids S is a real token). This needs
the engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the engine's default).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

KEY = "rstitch_switch"

# Shared by every engine of this process; keyed by each request's unique tag.
_FORCED: dict[str, int] = {}  # output index where S was forced
_ARMED: dict[str, int] = {}  # keep rule: output index of the crossing token (S is forced after it)


def forced(tag: str) -> int | None:
    """The output index where the sentinel was forced for request `tag` (state is cleared)."""
    _ARMED.pop(tag, None)
    return _FORCED.pop(tag, None)


class SwitchProcessor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        self.rows: dict[int, tuple[dict[str, Any], list[int]]] = {}  # batch index -> (rule, output ids)

    def is_argmax_invariant(self) -> bool:
        return False  # it forces tokens

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, _entry)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        indices = list(self.rows)
        vocab = self.rows[indices[0]][0]["vocab"]  # one engine, one vocabulary
        if vocab < logits.shape[-1]:
            logits[indices, vocab:] = float("-inf")
        ruled = [i for i in indices if self.rows[i][0]["tau"] is not None]
        if ruled:
            log_probs = torch.log_softmax(logits[ruled, :vocab], dim=-1)
            entropy = (-(log_probs.exp() * log_probs).nan_to_num().sum(-1) / math.log(vocab)).tolist()
            for index, h in zip(ruled, entropy):
                self._decide(logits, index, h)
        return logits

    def _decide(self, logits: torch.Tensor, index: int, h: float) -> None:
        """Steps run in output order; a step whose sample is thrown away (a chunk of a long
        prompt) is run again at the same output length, which overwrites what it recorded."""
        rule, output = self.rows[index]
        tag, n = rule["tag"], len(output)
        if _FORCED.get(tag) == n:
            del _FORCED[tag]
        if rule["keep_last"] and _ARMED.get(tag) == n - 1:  # the last sampled token crossed
            self._force(logits, index, rule, n)
            return
        crossed = h > rule["tau"] if rule["stop_above"] else h <= rule["tau"]
        if crossed and not rule["keep_last"]:
            self._force(logits, index, rule, n)
        elif crossed:
            _ARMED[tag] = n
        elif _ARMED.get(tag) == n:
            del _ARMED[tag]

    @staticmethod
    def _force(logits: torch.Tensor, index: int, rule: dict[str, Any], n: int) -> None:
        logits[index].fill_(float("-inf"))
        logits[index, rule["sentinel"]] = 0.0
        _FORCED[rule["tag"]] = n


def _entry(params: Any, _prompt: list[int] | None, output: list[int]) -> tuple[dict[str, Any], list[int]] | None:
    rule = (params.extra_args or {}).get(KEY)
    return None if rule is None else (rule, output)
