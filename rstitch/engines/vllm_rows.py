"""Verification rows kept on the device: the prompt positions' logits of a scoring request (docs/vllm.md,
"Distributions on the device"). vLLM 0.32 has no public hook on them: they are computed inside the model
runner (V1: `GPUModelRunner._get_prompt_logprobs_dict`, v1/worker/gpu_model_runner.py:5306; V2:
`PromptLogprobsWorker.compute_prompt_logprobs`, v1/worker/gpu/sample/prompt_logprob.py:120), so
`keep_prompt_rows` gives that step a subclass that first keeps the rows of requests carrying
`extra_args[CAPTURE_KEY]["prompt_from"]` in `vllm_switch.captured`. Needs the engine core in this process.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from rstitch.engines import vllm_switch

Span = tuple[int, int, int, int, int]  # serial, vocab, first hidden row, the position it predicts, rows
Want = tuple[int, int, int]  # serial, vocab, first predicted position


def prompt_from(params: Any) -> Want | None:
    """(serial, vocab, first predicted position) of a request that wants prompt rows kept."""
    capture = (getattr(params, "extra_args", None) or {}).get(vllm_switch.CAPTURE_KEY)
    if not capture or capture.get("prompt_from") is None:
        return None
    return capture["serial"], capture["vocab"], capture["prompt_from"]


def prompt_span(want: Want, offset: int, computed: int, scheduled: int, prompt_len: int) -> Span | None:
    """One request's rows in a step (hidden rows from `offset`, positions `computed` onwards): the row at
    position i, kept if token i + 1 is a prompt token from `prompt_from` on (the sampled row is the processor's)."""
    serial, vocab, first = want
    start = max(first, computed + 1)
    end = min(computed + scheduled, prompt_len - 1)  # last predicted position, inclusive
    if end < start:
        return None
    return serial, vocab, offset + start - 1 - computed, start, end - start + 1


def keep_rows(logits_fn: Callable[[torch.Tensor], torch.Tensor], hidden_states: torch.Tensor,
              spans: Iterable[Span | None]) -> None:
    """Compute the spans' logits rows (None: none this step) and keep them on the device (no host read of a value)."""
    present = [span for span in spans if span is not None]
    if not present:
        return
    logits = logits_fn(torch.cat([hidden_states[h: h + n] for _, _, h, _, n in present]))
    rows, first = [], 0
    for serial, vocab, _, position, n in present:
        rows += [(first + i, serial, vocab, position + i) for i in range(n)]
        first += n
    vllm_switch.capture_rows(logits, rows)


class PromptRowsV1:
    """Mixed before vLLM's V1 model runner (GPU or CPU): keeps the rows, then vLLM's own prompt step."""

    def _get_prompt_logprobs_dict(self, hidden_states: torch.Tensor, num_scheduled_tokens: dict[str, int]) -> Any:
        runner: Any = self
        spans = []
        for req_id, scheduled in num_scheduled_tokens.items():
            request = runner.requests.get(req_id)
            want = None if request is None or request.prompt_token_ids is None else prompt_from(request.sampling_params)
            if want is not None:
                offset = int(runner.query_start_loc.np[runner.input_batch.req_id_to_index[req_id]])
                spans.append(prompt_span(want, offset, request.num_computed_tokens, scheduled, len(request.prompt_token_ids)))
        keep_rows(runner.model.compute_logits, hidden_states, spans)
        return super()._get_prompt_logprobs_dict(hidden_states, num_scheduled_tokens)  # type: ignore[misc]


class PromptRowsV2:
    """Mixed before the V2 runner's `PromptLogprobsWorker` (checked on the CPU without an engine only)."""

    def add_request(self, req_id: str, req_idx: int, sampling_params: Any) -> None:
        wants: dict[int, Want] = self.__dict__.setdefault("rstitch_wants", {})
        want = prompt_from(sampling_params)
        if want is None:
            wants.pop(req_idx, None)
        else:
            wants[req_idx] = want
        super().add_request(req_id, req_idx, sampling_params)  # type: ignore[misc]

    def compute_prompt_logprobs(self, logits_fn: Callable[[torch.Tensor], torch.Tensor], hidden_states: torch.Tensor,
                                input_batch: Any, all_token_ids: torch.Tensor, num_computed_tokens: torch.Tensor,
                                prompt_lens: np.ndarray) -> Any:
        wants: dict[int, Want] = self.__dict__.get("rstitch_wants", {})
        if wants:
            keep_rows(logits_fn, hidden_states, v2_spans(wants, input_batch, prompt_lens))
        return super().compute_prompt_logprobs(  # type: ignore[misc]
            logits_fn, hidden_states, input_batch, all_token_ids, num_computed_tokens, prompt_lens)


def v2_spans(wants: dict[int, Want], input_batch: Any, prompt_lens: np.ndarray) -> list[Span | None]:
    """The spans of a V2 step (requests by their slot, `idx_mapping_np`), from host counts only."""
    starts = input_batch.query_start_loc_np
    return [prompt_span(wants[slot], int(starts[i]), int(input_batch.num_computed_prefill_tokens_np[i]),
                        int(starts[i + 1] - starts[i]), int(prompt_lens[slot]))
            for i, slot in enumerate(input_batch.idx_mapping_np.tolist()) if slot in wants]


@functools.cache
def _with(mixin: type, base: type) -> type:
    return type(f"RStitch{base.__name__}", (mixin, base), {})


def keep_prompt_rows(worker: Any) -> str:
    """Run in the worker: give its model runner's prompt step the row keeping; the runner found ("v1", "v2")."""
    runner = worker.model_runner
    prompt_worker = getattr(runner, "prompt_logprobs_worker", None)
    if prompt_worker is not None:  # V2: the runner's component for prompt rows
        if not isinstance(prompt_worker, PromptRowsV2):
            prompt_worker.__class__ = _with(PromptRowsV2, prompt_worker.__class__)
        return "v2"
    if not hasattr(runner, "_get_prompt_logprobs_dict"):
        raise RuntimeError(f"engine 'vllm': model runner {type(runner).__name__} has no prompt step to keep rows from")
    if not isinstance(runner, PromptRowsV1):
        runner.__class__ = _with(PromptRowsV1, runner.__class__)
    return "v1"
