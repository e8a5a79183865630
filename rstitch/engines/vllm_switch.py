"""vLLM logits processors that end a request at the first token crossing a `SwitchRule`, decided on
the device in the step that computes it (docs/vllm.md, "Runs of tokens are one request"), and keep
scoring requests' raw logits rows on the device ("Distributions on the device"). A request takes
part through `SamplingParams.extra_args[KEY]` (`check_rule`) or `[CAPTURE_KEY]` (`check_capture`).
Per-request values live in per-slot device tensors staged once per admission: `apply` reads no
device value on the host; the caller reads forced steps' device log once per run (`forced`).
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

KEY = "rstitch_switch"
CAPTURE_KEY = "rstitch_capture"
LOG_SIZE = 4096  # forced steps are logged by serial modulo this (far more than requests in flight)
RULE_KEYS = {"serial": int, "vocab": int, "sentinel": int, "stop_above": bool, "keep_last": bool}

# int columns of a slot's row in SwitchState.ints, float columns in SwitchState.floats
ACTIVE, SERIAL, VOCAB, SENTINEL, RULED, STOP_ABOVE, KEEP_LAST, SEED = range(8)
TAU, TEMPERATURE, TOP_P = range(3)

_SERIALS = itertools.count()
_STATES: weakref.WeakSet[SwitchState] = weakref.WeakSet()  # every processor's state in this process
_OWNERS: OrderedDict[int, weakref.ref[SwitchState]] = OrderedDict()  # serial -> the state that admitted it
# serial -> {sequence position: raw logits row [V] on the device}, of requests that asked for it
_CAPTURED: OrderedDict[int, dict[int, torch.Tensor]] = OrderedDict()


def new_serial() -> int:
    """A serial no other request of this process carries."""
    return next(_SERIALS)


def forced(serial: int, position: int) -> tuple[bool, int]:
    """Whether the sentinel at `position` of request `serial` was forced, and the token kept (-1: dropped)."""
    owner = _OWNERS.pop(serial, None)
    states = [owner()] if owner is not None else list(_STATES)
    for state in states:
        hit = None if state is None else state.read_log(serial, position)
        if hit is not None:
            return True, hit
    return False, -1


def captured(serial: int) -> dict[int, torch.Tensor]:
    """Request `serial`'s raw logits rows ([V] on the device) by the position each predicts; taken once."""
    return _CAPTURED.pop(serial, {})


def capture_rows(logits: torch.Tensor, rows: list[tuple[int, int, int, int]]) -> None:
    """Keep copies of rows of `logits` on the device, (row, serial, vocab, position) each (edited in place after)."""
    for row, serial, vocab, position in rows:
        _CAPTURED.setdefault(serial, {})[position] = logits[row, :vocab].float().clone()
        _CAPTURED.move_to_end(serial)
    while len(_CAPTURED) > LOG_SIZE:  # requests whose rows were never taken (failed, aborted)
        _CAPTURED.popitem(last=False)


def check_capture(capture: Any) -> None:
    """A `ValueError` for a malformed capture request."""
    if (not isinstance(capture, dict) or not {"serial", "vocab"} <= set(capture) <= {"serial", "vocab", "prompt_from"}
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in capture.values())):
        raise ValueError(f"extra_args[{CAPTURE_KEY!r}] must be a dict of ints with keys ['serial', 'vocab'] "
                         f"and optionally 'prompt_from', got {capture!r}")


def check_rule(rule: Any) -> None:
    """A `ValueError` for a malformed rule (vLLM fails the request with it at admission)."""
    if not isinstance(rule, dict) or set(rule) != {*RULE_KEYS, "tau"}:
        raise ValueError(f"extra_args[{KEY!r}] must be a dict with keys {sorted({*RULE_KEYS, 'tau'})}, got {rule!r}")
    for key, kind in RULE_KEYS.items():
        if not isinstance(rule[key], kind):
            raise ValueError(f"extra_args[{KEY!r}][{key!r}] must be {kind.__name__}, got {rule[key]!r}")
    if rule["tau"] is not None and not isinstance(rule["tau"], float):
        raise ValueError(f"extra_args[{KEY!r}]['tau'] must be a float or None, got {rule['tau']!r}")


class SwitchState:
    """Per-slot rule tables on the device, their host staging copies, and the forced-step log."""

    def __init__(self, max_slots: int, device: torch.device):
        self.host_ints = np.zeros((max_slots, 8), dtype=np.int64)
        self.host_floats = np.zeros((max_slots, 3), dtype=np.float32)
        self.ints = torch.zeros((max_slots, 8), dtype=torch.long, device=device)
        self.floats = torch.zeros((max_slots, 3), dtype=torch.float32, device=device)
        self._staged: list[torch.Tensor] = []  # host buffers of the last copy, alive until it ran
        self._dirty = False
        # serial, position and kept token of each request's forced step; the last entry takes unruled rows
        self.log = torch.full((LOG_SIZE + 1, 3), -1, dtype=torch.long, device=device)
        _STATES.add(self)

    def stage(self, slot: int, rule: dict[str, Any] | None, temperature: float, top_p: float, seed: int) -> bool:
        """Write slot `slot`'s row (inactive without a rule); True if the slot is ruled."""
        self._dirty = True
        if rule is None:
            self.host_ints[slot] = 0
            return False
        ruled = rule["tau"] is not None
        _OWNERS[rule["serial"]] = weakref.ref(self)
        if len(_OWNERS) > LOG_SIZE:  # serials of runs that never ended on the sentinel
            _OWNERS.popitem(last=False)
        self.host_ints[slot] = (1, rule["serial"], rule["vocab"], rule["sentinel"], ruled, rule["stop_above"],
                                rule["keep_last"], seed)
        self.host_floats[slot] = (rule["tau"] if ruled else 0.0, temperature, top_p)
        return True

    def flush(self) -> None:
        """Copy the staged rows to the device (once per batch change, never per step)."""
        if not self._dirty:
            return
        self._dirty = False
        # Fresh pageable host copies (the staging arrays change at the next admission; pinning would allocate).
        staged = [torch.from_numpy(self.host_ints.copy()), torch.from_numpy(self.host_floats.copy())]
        self.ints.copy_(staged[0], non_blocking=True)
        self.floats.copy_(staged[1], non_blocking=True)
        self._staged = staged

    def apply(self, logits: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, host_slots: np.ndarray) -> None:
        """Mask, decide and force the rows of ruled requests in place; log forced steps (`positions`: each
        row's sampled token's; `host_slots`: the rows' slots, read in the host tables: no device read)."""
        ints, floats = self.ints[slots], self.floats[slots]
        active = ints[:, ACTIVE].bool()
        columns = torch.arange(logits.shape[-1], device=logits.device)
        logits.masked_fill_(active[:, None] & (columns[None, :] >= ints[:, VOCAB, None]), float("-inf"))
        host = self.host_ints[host_slots]
        if not host[:, RULED].any():  # no rule that can end a run: only the mask applies
            return
        # A sampled keep-rule run draws the token it keeps.
        draw = bool((host[:, RULED] & host[:, KEEP_LAST] & (self.host_floats[host_slots, TEMPERATURE] > 0)).any())
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = -(log_probs.exp() * log_probs).nan_to_num().sum(-1) / ints[:, VOCAB].clamp(min=2).float().log()
        above = entropy > floats[:, TAU]
        crossed = active & ints[:, RULED].bool() & torch.where(ints[:, STOP_ABOVE].bool(), above, ~above)
        kept = self._kept_token(logits, floats, ints[:, SEED], positions, draw)
        kept = torch.where(ints[:, KEEP_LAST].bool(), kept, -1)
        sentinel = ints[:, SENTINEL, None]
        logits.masked_fill_(crossed[:, None], float("-inf"))
        logits.scatter_(1, sentinel, torch.where(crossed[:, None], 0.0, logits.gather(1, sentinel)))
        self._log(torch.where(active, ints[:, SERIAL], -1), positions, crossed, kept)

    @staticmethod
    def _kept_token(logits: torch.Tensor, floats: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                    draw: bool) -> torch.Tensor:
        """The token each row would sample: the argmax, or a top-p draw at its temperature (Gumbel-max
        with noise hashed from the request's seed and the position: reproducible per seed)."""
        greedy = logits.argmax(-1)
        if not draw:
            return greedy
        temperature = floats[:, TEMPERATURE]
        scaled = logits / temperature.clamp(min=1e-6)[:, None]
        ordered, order = scaled.sort(-1, descending=True)
        probs = ordered.softmax(-1)
        outside = (probs.cumsum(-1) - probs) > floats[:, TOP_P, None]  # the top token always stays
        scaled = scaled.scatter(1, order, ordered.masked_fill(outside, float("-inf")))
        uniform = _hashed_uniform(seeds, positions, logits.shape[-1])
        drawn = (scaled.double() - (-uniform.log()).log()).argmax(-1)
        return torch.where(temperature > 0, drawn, greedy)

    def _log(self, serials: torch.Tensor, positions: torch.Tensor, crossed: torch.Tensor, kept: torch.Tensor) -> None:
        """Write a forced step unless an earlier one is logged (a step after the stop, async scheduling);
        an unforced step at the logged position clears it (a chunked prefill's discarded sample)."""
        entry = torch.where(serials >= 0, serials % LOG_SIZE, LOG_SIZE)
        current = self.log[entry]
        same = current[:, 0] == serials
        write = crossed & (~same | (current[:, 1] < 0) | (current[:, 1] >= positions))
        clear = ~crossed & same & (current[:, 1] == positions)
        new = torch.stack([serials, positions, kept], dim=1)
        cleared = torch.stack([current[:, 0], torch.full_like(positions, -1), current[:, 2]], dim=1)
        self.log.index_put_((entry,), torch.where(write[:, None], new, torch.where(clear[:, None], cleared, current)))

    def read_log(self, serial: int, position: int) -> int | None:
        logged_serial, logged_position, kept = self.log[serial % LOG_SIZE].tolist()
        return kept if (logged_serial, logged_position) == (serial, position) else None


def _hashed_uniform(seeds: torch.Tensor, positions: torch.Tensor, width: int) -> torch.Tensor:
    """Uniform noise in (0, 1), float64 [rows, width]: a splitmix64-style hash of (seed, position, column)."""
    columns = torch.arange(width, device=seeds.device)
    x = seeds[:, None] * 0x9E3779B97F4A7C1 + positions[:, None] * 0x632BE59BD9B4E01 + columns[None, :]
    for shift, factor in ((30, 0x5851F42D4C957F2D), (27, 0x14057B7EF767814F)):
        x = (x ^ (x >> shift)) * factor
    x = x ^ (x >> 31)
    return ((x & ((1 << 52) - 1)).double() + 0.5) / float(1 << 52)


def _rule_of(params: Any) -> dict[str, Any] | None:
    return (getattr(params, "extra_args", None) or {}).get(KEY)


def _capture_of(params: Any) -> tuple[int, int] | None:
    capture = (getattr(params, "extra_args", None) or {}).get(CAPTURE_KEY)
    return None if capture is None else (capture["serial"], capture["vocab"])


def _validate(sampling_params: Any) -> None:
    extra = getattr(sampling_params, "extra_args", None) or {}
    for key, check in ((KEY, check_rule), (CAPTURE_KEY, check_capture)):
        if extra.get(key) is not None:
            check(extra[key])


def _sampling(params: Any) -> tuple[float, float, int]:
    return (float(params.temperature or 0.0), float(params.top_p if params.top_p is not None else 1.0),
            int(params.seed or 0))


class SwitchProcessorV2(V2LogitsProcessor):
    """The V2 model runner's interface: slots are the runner's persistent request slots."""

    def __init__(self, vllm_config: Any, req_states: LogitsProcRequestState):
        self.state = SwitchState(req_states.max_num_reqs, torch.device(req_states.device))
        self.captures: dict[int, tuple[int, int] | None] = {}  # slot -> (serial, vocab), None: keeps no rows

    validate_params = staticmethod(_validate)  # vLLM calls it on the class

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        self.captures[req_idx] = capture = _capture_of(sampling_params)
        return self.state.stage(req_idx, _rule_of(sampling_params), *_sampling(sampling_params)) or capture is not None

    def apply_staged_writes(self) -> None:
        self.state.flush()

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        # One row per request (no speculative rows); positions from the host bounds.
        capture_rows(logits, [(b, *capture, int(ctx.seq_lens_upper_bound_np[b]))
                              for b, slot in enumerate(ctx.idx_mapping_np.tolist()) if (capture := self.captures.get(slot))])
        slots = ctx.idx_mapping_np
        if not self.state.host_ints[slots, ACTIVE].any():
            return logits
        self.state.apply(logits, ctx.expanded_idx_mapping.long(), ctx.pos.long() + 1, slots)
        return logits


class SwitchProcessor(V1LogitsProcessor):
    """The V1 model runner's interface: slots are batch rows (moved as vLLM reorders the batch);
    positions from the prompt and output lengths vLLM keeps on the host."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        max_rows = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None) or 1024)
        self.state = SwitchState(max_rows, torch.device(device))
        self._slots = torch.arange(max_rows, device=device)  # batch rows are the slots
        self.rows: dict[int, tuple[dict[str, Any], Any, int, list[int]]] = {}  # row -> rule, params, prompt, output
        self.captures: dict[int, tuple[int, int, int, list[int]]] = {}  # row -> serial, vocab, prompt, output

    validate_params = staticmethod(_validate)

    def is_argmax_invariant(self) -> bool:
        return False  # it forces tokens

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.captures, batch_update, _v1_capture_entry)
        if process_dict_updates(self.rows, batch_update, _v1_entry):
            self.state.host_ints[:] = 0  # rows move: restage every row
            for row, (rule, params, _, _) in self.rows.items():
                self.state.stage(row, rule, *_sampling(params))
            self.state.flush()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        if self.captures:  # the raw row, before any rule masks it; the position of the token it predicts
            capture_rows(logits, [(row, serial, vocab, prompt_len + len(output))
                                  for row, (serial, vocab, prompt_len, output) in self.captures.items() if row < n])
        if not self.rows:
            return logits
        positions = np.zeros(n, dtype=np.int64)
        for row, (_, _, prompt_len, output) in self.rows.items():
            if row < n:
                positions[row] = prompt_len + len(output)
        self.state.apply(logits, self._slots[:n], torch.from_numpy(positions).to(logits.device, non_blocking=True),
                         np.arange(n))
        return logits


def _v1_capture_entry(params: Any, prompt: list[int] | None, output: list[int]) -> tuple[int, int, int, list[int]] | None:
    capture = _capture_of(params)
    return None if capture is None else (*capture, len(prompt or []), output)


def _v1_entry(params: Any, prompt: list[int] | None, output: list[int]) -> tuple[dict[str, Any], Any, int, list[int]] | None:
    rule = _rule_of(params)
    return None if rule is None else (rule, params, len(prompt or []), output)
