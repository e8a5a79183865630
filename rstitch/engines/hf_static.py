"""The HF engine's static decode path (`engine.compile`): preallocated KV slots, forwards of a few
fixed shapes, and on CUDA those forwards replayed as CUDA graphs (docs/gpu.md, "The static decode
path", explains each part). The last position of every slot is scratch: padding rows and columns
write their keys there. Outputs equal the eager path's up to floating-point rounding
(tests/engines/test_static_cache.py).
"""
from __future__ import annotations

import bisect
import heapq
import logging
import time
import weakref
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import Cache

from rstitch.engines.base import ForwardRequest, Sequence, TokenDistribution
from rstitch.engines.hf_forward import (
    KVBuffers,
    ViewLayer,
    attention_implementation,
    attention_mask,
    cache_kwargs,
    compiled_path,
    kv_shape,
)
from rstitch.errors import ConfigError

if TYPE_CHECKING:
    from rstitch.engines.hf import HFModelRunner

log = logging.getLogger("rstitch")

MODES = ("auto", "off", "static", "graphs", "inductor")
WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)  # forward widths with their own captured step
# Steps at most this wide (and this many positions) compute the head and summaries of every position;
# wider ones (prefills) only the hidden states, then the head on the kept positions: full-vocabulary
# logits cost 0.6 MB per position in float32.
FULL_STEP_WIDTH = 16
FULL_STEP_POSITIONS = 256
INITIAL_LENGTH = 2048  # positions per slot at first (a power of two); doubles when outgrown
MIN_READ = 128  # the shortest attention window (positions of a slot read); `read_bucket` above
# Heads that are exactly lm_head(final hidden state), attention that takes a 4D mask: the static and the batched forwards
STATIC_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral"}
GROUPED_ATTENTION = "rstitch_grouped_sdpa"  # the name grouped_attention is registered under


def resolve_mode(value: Any, device: torch.device) -> str:
    """`engine.compile` as one of off / static / graphs / inductor (auto: graphs on CUDA, else off)."""
    if value not in (*MODES, True, False, None):
        raise ConfigError(f"engine.compile must be one of {', '.join(MODES)} (or true/false), got {value!r}")
    value = compiled_path(value, device.type)
    if value == "graphs" and device.type != "cuda":
        raise ConfigError(f"engine.compile=graphs captures CUDA graphs and needs pair.device=cuda (got {device}); "
                          "engine.compile=static runs the same static-cache path without capture on any device, "
                          "engine.compile=inductor compiles it")
    return value


def check_supported(model: Any, mode: str) -> None:
    config = model.config
    problem = None
    if config.model_type not in STATIC_MODEL_TYPES:
        problem = f"model type '{config.model_type}' (supported: {', '.join(sorted(STATIC_MODEL_TYPES))})"
    elif attention_implementation(config) not in ("sdpa", "eager"):
        problem = f"attention '{attention_implementation(config)}' (supported: sdpa, eager)"
    elif any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        problem = "sliding-window layers"
    if problem:
        raise ConfigError(f"engine.compile={mode}: the static decode path does not handle {problem}; use engine.compile=off")


def kv_bytes(config: Any, dtype: torch.dtype, slots: int, length: int) -> int:
    """Bytes of a static KV cache of `slots` sequences x `length` positions (keys and values)."""
    layers, heads, head_dim = kv_shape(config)
    return 2 * layers * slots * heads * length * head_dim * torch.empty((), dtype=dtype).element_size()


def check_kv_budget(config: Any, dtype: torch.dtype, slots: int, length: int, budget_bytes: int, name: str) -> None:
    """One error line, naming what fits, when `slots` x `length` positions of KV exceed `budget_bytes`."""
    needed = kv_bytes(config, dtype, slots, length)
    if needed <= budget_bytes:
        return
    per_position = kv_bytes(config, dtype, 1, 1)
    fit_slots, fit_length = budget_bytes // (per_position * length), budget_bytes // (per_position * slots)
    gib = 1 << 30
    raise ConfigError(f"the KV cache of {name} needs {needed / gib:.1f} GiB for {slots} sequences x {length} positions, "
                      f"{budget_bytes / gib:.1f} GiB are free: {fit_slots} sequences fit at {length} positions, "
                      f"or {slots} at {fit_length} positions (lower batch_size or max_new_tokens)")


def grown_slots(sequences: int) -> int:
    """The slots (a power of two: one at first, doubled when outgrown) that hold `sequences` at once."""
    return 1 << (sequences - 1).bit_length()


def grown_length(positions: int) -> int:
    """The slot length (`INITIAL_LENGTH`, doubled when outgrown) for `positions` + the scratch position."""
    return max(INITIAL_LENGTH, grown_slots(positions + 1))


def weight_bytes(config: Any, dtype: torch.dtype) -> int:
    """The weights of `config`'s causal LM in `dtype`, counted on a weightless (meta-device) instance."""
    from rstitch.engines.loading import count_parameters

    return count_parameters(config) * torch.empty((), dtype=dtype).element_size()


def check_static_memory(models: dict[str, tuple[Any, torch.dtype, bool]], batch_size: int, positions: int,
                        free_bytes: int) -> None:
    """Before any model loads: one error line, naming what fits, when the weights of `models` (name ->
    config, dtype, takes the static path) and the static slots for `batch_size` x `positions` exceed `free_bytes`."""
    weights = sum(weight_bytes(config, dtype) for config, dtype, _ in models.values())
    per_position = sum(kv_bytes(config, dtype, 1, 1) for config, dtype, static in models.values() if static)
    slots, length = grown_slots(batch_size), grown_length(positions)
    budget = free_bytes - weights
    if slots * length * per_position <= budget:
        return
    fit_slots = next((s for s in (slots >> k for k in range(slots.bit_length())) if s * length * per_position <= budget), 0)
    fit_length = next((n for n in (length >> k for k in range(length.bit_length()))
                       if n >= INITIAL_LENGTH and slots * n * per_position <= budget), 0)
    gib = 1 << 30
    at_this_length = f"batch_size={fit_slots} fits at this length" if fit_slots else "no batch size fits at this length"
    at_this_batch = (f"batch_size={batch_size} fits up to {fit_length - 1} positions per sample" if fit_length
                     else f"no length fits at batch_size={batch_size}")
    raise ConfigError(
        f"{' + '.join(models)} need {weights / gib:.1f} GiB of weights + {slots * length * per_position / gib:.1f} GiB "
        f"of static KV cache for batch_size={batch_size} at up to {positions} positions per sample ({slots} slots x "
        f"{length} positions), {free_bytes / gib:.1f} GiB of GPU memory are free: {at_this_length}, {at_this_batch} "
        "(lower batch_size or max_new_tokens)")


def grouped_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA over grouped keys and values as stored ([R, kv heads, S, D]): the G query heads of each KV
    head go along the query axis, so the keys are never copied per query head (transformers' SDPA
    path repeats them whenever a mask is given). Returns [R, W, heads, D] as sdpa_attention_forward."""
    rows, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    stacked = query.reshape(rows, kv_heads, group * width, dim)  # head h = kv head h // G, member h % G
    mask = attention_mask
    if mask is not None and group > 1:
        mask = mask[:, :, None].expand(rows, mask.shape[1], group, width, mask.shape[-1])
        mask = mask.reshape(rows, -1, group * width, mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)
    return out.reshape(rows, heads, width, dim).transpose(1, 2).contiguous(), None


class StaticSequence(Sequence):
    """A sequence whose keys and values live in one slot of its runner's `StaticDecoder`."""

    runner: HFModelRunner

    def __init__(self, runner: HFModelRunner, prompt_ids: Seq[int], want_hidden: bool = False):
        super().__init__(runner, prompt_ids, want_hidden)
        decoder = runner.static
        assert decoder is not None, "a runner opens static sequences only with its decoder"
        self._slot = [decoder.kv.acquire()]  # a box: the decoder may move the sequence to another slot
        box = self._slot
        weakref.finalize(self, lambda: decoder.kv.release(box[0]))
        self._summaries: list[tuple[float, int]] = []  # (entropy, argmax) of each window row

    @property
    def slot(self) -> int:
        return self._slot[0]

    @slot.setter
    def slot(self, value: int) -> None:
        self._slot[0] = value

    def _forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        decoder = self.runner.static
        assert decoder is not None
        return decoder.forward([ForwardRequest(self.runner, self, new_ids, keep)])[0]

    def _crop(self, n_keep: int) -> None:
        """Nothing moves: the slot's valid length is `n_cached`, which the base class lowers."""

    def _dist_at(self, position: int) -> TokenDistribution:
        dist = super()._dist_at(position)
        entropy, argmax = self._summaries[position - self._window_start]
        # The cached properties' values, from the forward's one transfer: reading them syncs nothing.
        dist.__dict__.update(entropy=entropy, argmax=argmax)
        return dist


class StaticKV(KVBuffers):
    """The static path's slots, with the views each step shape reads."""

    def __init__(self, config: Any, dtype: torch.dtype, device: torch.device, name: str, on_resize: Callable[[], None]):
        self.config, self.name, self.on_resize = config, name, on_resize
        self._views: dict[tuple[Any, ...], Any] = {}  # made once per step shape (stale after a resize)
        # False under torch.compile: views kept between calls would enter its graphs as inputs, not
        # as views of the buffers, and tensors made while tracing would be outputs a replay overwrites.
        self.memoize = True
        super().__init__(config, dtype, device, 1, INITIAL_LENGTH)

    def resize(self, slots: int, length: int) -> None:
        """Grow, keeping what is stored; on CUDA the budget is checked first, once the captured steps
        (stale now: `on_resize`) are dropped."""
        self.on_resize()
        self._views.clear()
        if self.device.type == "cuda":
            held = kv_bytes(self.config, self.dtype, self.slots, self.length)
            check_kv_budget(self.config, self.dtype, slots, length, torch.cuda.mem_get_info(self.device)[0] + held,
                            self.name)
        log.info("static cache of %s: %d slots x %d positions", self.name, slots, length)
        super().resize(slots, length)

    def windows(self, rows: int, read: int) -> list[tuple[torch.Tensor, ...]]:
        """Per layer, views of rows [0, R) of its keys and values and of their first `read` positions."""
        return self._memo(("windows", rows, read), lambda: [(k[:rows], v[:rows], k[:rows, :, :read], v[:rows, :, :read])
                                                            for k, v in zip(self.keys, self.values)])

    def columns(self, read: int) -> torch.Tensor:
        """0 .. read-1 on the cache's device (the key positions a step's mask compares against)."""
        return self._memo(("columns", read), lambda: torch.arange(read, device=self.device))

    def _memo(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """`make()`, made once per key unless `memoize` is off."""
        if not self.memoize:
            return make()
        if key not in self._views:
            self._views[key] = make()
        return self._views[key]


class _RowsLayer(ViewLayer):
    """One layer of a step's cache: writes the new keys at each row's positions, reads the first `read`."""

    def __init__(self, window: tuple[torch.Tensor, ...], positions: torch.Tensor, first_row: torch.Tensor | None,
                 row_index: torch.Tensor | None, read: int):
        super().__init__(read)
        self.window, self.positions, self.first_row, self.row_index = window, positions, first_row, row_index

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        key_rows, value_rows, key_read, value_read = self.window
        for rows, new in ((key_rows, key_states), (value_rows, value_states)):
            if self.first_row is not None:
                rows.index_copy_(2, self.first_row, new)
            else:
                rows[self.row_index, :, self.positions] = new.transpose(1, 2)
        return key_read, value_read


class CaptureStream:
    """One side stream per device for every warm-up and capture (a stream's cuBLAS workspace is made at
    its first matmul: warming up there keeps it out of the graphs' pool), and the pool captured into."""

    _streams: dict[torch.device, Any] = {}

    def __init__(self, device: torch.device):
        self.device = device
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        self.stream = self._streams[device]
        self.pool = torch.cuda.graph_pool_handle()


def unowned_alias(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor over `tensor`'s memory that does not keep it alive (vLLM's weak_ref_tensor): the graph's
    pool holds it, and later captures may reuse it once the step's results are copied out."""
    # torch has no public way to make a tensor that does not own its memory (vLLM has a C++ op of its own)
    storage = torch._C._construct_storage_from_data_pointer(
        tensor.untyped_storage().data_ptr(), tensor.device, tensor.untyped_storage().nbytes())
    alias = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return alias.set_(storage, tensor.storage_offset(), tensor.shape, tensor.stride())


class _Step:
    """One (rows, width, read) forward over static inputs filled in place; outputs overwritten by the next run."""

    def __init__(self, decoder: StaticDecoder, rows: int, width: int, read: int, capture: str):
        device = decoder.kv.device
        self.decoder, self.read = decoder, read
        self.inputs = torch.zeros((2, rows, width), dtype=torch.long, device=device)  # filled by one copy per forward
        self.ids, self.positions = self.inputs[0], self.inputs[1]
        self.graph: Any = None
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.full = width <= FULL_STEP_WIDTH and rows * width <= FULL_STEP_POSITIONS
        step = decoder.compute if self.full else decoder.hidden_only
        self.compute: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, ...]] = step
        if capture == "inductor":
            # Fixed addresses: else the in-place writes count as mutated inputs and the compiled step
            # skips its CUDA graph (HF's StaticCache marks its own so; torch has no public form).
            for buffer in (*decoder.kv.keys, *decoder.kv.values):
                torch._dynamo.mark_static_address(buffer)
            mode = "reduce-overhead" if device.type == "cuda" else "default"
            self.compute = torch.compile(step, mode=mode, dynamic=False)
        if capture in ("graphs", "inductor"):
            self.positions.fill_(decoder.kv.length - 1)  # every row and column writes to the scratch position
            self._warm_up(capture)

    def _call(self) -> tuple[torch.Tensor, ...]:
        return self.compute(self.ids, self.positions, self.read)

    def _warm_up(self, capture: str) -> None:
        if capture == "inductor" and self.ids.device.type != "cuda":
            self._call()  # compiles; nothing is captured on a CPU
            return
        streams = self.decoder.streams
        assert streams is not None, "a decoder that captures has its capture stream"
        current = torch.cuda.current_stream(streams.device)
        streams.stream.wait_stream(current)
        with torch.cuda.stream(streams.stream):
            for _ in range(3 if capture == "inductor" else 2):  # inductor records its graph on a later call
                self._call()
        current.wait_stream(streams.stream)
        if capture == "graphs":
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=streams.pool, stream=streams.stream):
                outputs = self._call()
            self.outputs = tuple(unowned_alias(t) for t in outputs)

    def run(self) -> tuple[torch.Tensor, ...]:
        if self.graph is not None:
            self.graph.replay()
            assert self.outputs is not None
            return self.outputs
        return self._call()


class StaticDecoder:
    """A runner's static slots and captured steps (see the module docstring)."""

    def __init__(self, runner: HFModelRunner, mode: str):
        check_supported(runner.model, mode)
        self.runner, self.mode = runner, mode
        self.model = runner.model
        self.base = getattr(self.model, self.model.base_model_prefix)
        [self.cache_argument] = cache_kwargs(self.base, None)  # read once: torch.compile traces no functools.cache
        self.head = self.model.get_output_embeddings()
        self.steps: dict[tuple[int, int, int], _Step] = {}
        captures = mode == "graphs" or (mode == "inductor" and runner.device.type == "cuda")
        self.streams = CaptureStream(runner.device) if captures else None
        self.kv = StaticKV(self.model.config, self.model.dtype, runner.device, runner.name, self._drop_steps)
        self.captured = 0  # steps captured or compiled so far (growth recaptures)
        self.capture_spans: list[tuple[float, float]] = []  # (start, seconds) of each capture or compilation
        self._capture_total = [0.0]  # seconds of the first k spans: the runner asks after every forward
        self.attention = GROUPED_ATTENTION if attention_implementation(self.model.config) == "sdpa" else "eager"
        if self.attention == GROUPED_ATTENTION:
            from transformers import AttentionInterface

            AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
        if mode == "inductor":
            # Past `recompile_limit` (8) Dynamo runs the step uncompiled without a word: cover every
            # shape (as vLLM): row buckets x widths x attention windows (two per doubling up to 2**20).
            dynamo, shapes = torch._dynamo.config, 8 * len(WIDTHS) * 26
            dynamo.recompile_limit = max(dynamo.recompile_limit, shapes)
            dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * shapes)
            self.kv.memoize = False

    def _drop_steps(self) -> None:
        self.steps.clear()
        if self.streams is not None:  # every graph was freed: a handle whose graphs were all freed cannot be reused
            self.streams.pool = torch.cuda.graph_pool_handle()

    def _compact(self, seqs: list[StaticSequence]) -> None:
        """Move the sequences of the highest slots to free lower ones when that lowers the step's rows (a
        straggler in slot 31 would make every step compute 32); a move copies its cached positions."""
        if grown_slots(max(s.slot for s in seqs) + 1) <= grown_slots(len(seqs)):
            return
        while self.kv.free and self.kv.free[0] < max(s.slot for s in seqs):
            seq = max(seqs, key=lambda s: s.slot)
            target = heapq.heappop(self.kv.free)
            for store in (*self.kv.keys, *self.kv.values):  # its cached positions, to the lower slot
                store[target, :, : seq.n_cached] = store[seq.slot, :, : seq.n_cached]
            self.kv.release(seq.slot)
            seq.slot = target

    @torch.inference_mode()  # as every forward: steps are captured as they will run
    def warm_up(self, batch_size: int, shortest: int, longest: int) -> int:
        """Before a run's first timed sample: grow the cache to the run's size (`batch_size` x the slots a
        warm-up sample held, its longest sample) and capture every step it can use (`warm_shapes`);
        `graphs` only (`inductor` stays lazy). Returns the steps captured."""
        if self.mode != "graphs":
            return 0
        self.kv.reserve(grown_slots(batch_size * max(self.kv.peak_in_use, 1)), grown_length(longest))
        before, began = self.captured, time.perf_counter()
        for rows, width, read in warm_shapes(self.kv.slots, self.kv.length, shortest, longest):
            self._step(rows, width, read)
        log.info("%s: %d static steps captured in %.1f s (%d slots x %d positions)", self.runner.name,
                 self.captured - before, time.perf_counter() - began, self.kv.slots, self.kv.length)
        return self.captured - before

    @torch.inference_mode()
    def forward(self, requests: list[ForwardRequest]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The requests' forwards in one step (the runner groups them by width first: `forward_by_width`)."""
        seqs = [r.seq for r in requests]
        assert all(isinstance(s, StaticSequence) for s in seqs), "a static runner's sequences are StaticSequences"
        self._compact(seqs)  # type: ignore[arg-type]
        slots = [s.slot for s in seqs]  # type: ignore[attr-defined]
        widest = max(len(r.new_ids) for r in requests)
        live = max(s.n_cached for s in seqs) + widest
        self.kv.make_room(live + 1)  # + the scratch position
        rows, width, read = step_shape(max(slots), widest, live, self.kv.slots, self.kv.length)
        step = self._step(rows, width, read)
        cells = rows * width
        inputs = [0] * cells + [self.kv.length - 1] * cells  # ids, then positions; padding: scratch
        for slot, r, s in zip(slots, requests, seqs):
            n, first = len(r.new_ids), slot * width
            inputs[first: first + n] = r.new_ids
            inputs[cells + first: cells + first + n] = range(s.n_cached, s.n_cached + n)
        step.inputs.copy_(torch.tensor(inputs, dtype=torch.long).view(2, rows, width))  # built on the host: one copy
        outputs = step.run()
        if len(requests) == 1:  # one request: a slice of the outputs, no index to build
            start = slots[0] * width + len(requests[0].new_ids) - requests[0].keep
            kept: slice | torch.Tensor = slice(start, start + requests[0].keep)
        else:
            kept = torch.tensor([slot * width + i for slot, r in zip(slots, requests)
                                 for i in range(len(r.new_ids) - r.keep, len(r.new_ids))], device=self.kv.device)
        want_hidden = any(r.seq.want_hidden for r in requests)
        if step.full:
            logits, summary, hidden = outputs
            kept_logits, kept_summary = _take(logits, kept), _take(summary, kept, copy=False)
            kept_hidden = _take(hidden, kept) if want_hidden else None
        else:
            kept_hidden = _take(outputs[0], kept)
            kept_logits, kept_summary = self.summarize(kept_hidden)
        summaries = kept_summary.tolist()  # the one sync
        hidden_out = kept_hidden.float() if want_hidden and kept_hidden is not None else None
        out, start = [], 0  # each request's rows of the kept outputs; its summaries go to its sequence
        for r, s in zip(requests, seqs):
            s._summaries = [(e, int(a)) for e, a in summaries[start: start + r.keep]]  # type: ignore[attr-defined]
            h = hidden_out[start: start + r.keep] if hidden_out is not None and s.want_hidden else None
            out.append((kept_logits[start: start + r.keep], h))
            start += r.keep
        return out

    def _step(self, rows: int, width: int, read: int) -> _Step:
        if width not in WIDTHS:  # a wide prefill (a prompt) runs once: no capture, nothing kept
            return _Step(self, rows, width, read, "static")
        key = (rows, width, read)
        if key not in self.steps:
            began = time.perf_counter()
            self.steps[key] = _Step(self, rows, width, read, self.mode)
            if self.mode != "static":
                self.runner.synchronize()
                self.captured += 1
                self.capture_spans.append((began, time.perf_counter() - began))
                self._capture_total.append(self._capture_total[-1] + self.capture_spans[-1][1])
        return self.steps[key]

    def capture_seconds_since(self, start: float) -> float:
        """Seconds spent capturing or compiling steps since `start` (a perf_counter reading)."""
        first = bisect.bisect_left(self.capture_spans, (start,))  # spans are appended in time order
        return self._capture_total[-1] - self._capture_total[first]

    def compute(self, ids: torch.Tensor, positions: torch.Tensor, read: int) -> tuple[torch.Tensor, ...]:
        """The step itself, device work only: logits, summaries (`summarize`) and hidden states."""
        [hidden] = self.hidden_only(ids, positions, read)
        return (*self.summarize(hidden), hidden)

    def summarize(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and per position (entropy, argmax) as one float64 pair (exact for any index): one transfer."""
        logits = self.head(hidden)[..., : self.runner.vocab_size].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = -(log_probs.exp() * log_probs).nan_to_num().sum(-1)
        return logits, torch.stack([entropy.double(), logits.argmax(-1).double()], dim=-1)

    def hidden_only(self, ids: torch.Tensor, positions: torch.Tensor, read: int) -> tuple[torch.Tensor]:
        """The model's final hidden states [R, W, H] (its keys and values written to the slots)."""
        rows = ids.shape[0]
        mask = attention_mask(self.kv.columns(read) <= positions[:, :, None], self.attention, self.model.dtype)
        first_row = positions[0] if rows == 1 else None  # batch 1: a copy along the length axis, not a scattered write
        row_index = torch.arange(rows, device=positions.device)[:, None] if rows > 1 else None
        view = Cache(layers=[_RowsLayer(window, positions, first_row, row_index, read) for window in self.kv.windows(rows, read)])
        # Attention looks its function up by `config._attn_implementation` at every call: set the
        # decoder's and restore it. The private field: the public `set_attn_implementation`
        # validates at each call and would set it for every user of the shared weights.
        config = self.model.config
        saved, config._attn_implementation_internal = config._attn_implementation_internal, self.attention
        try:
            out = self.base(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                            **{self.cache_argument: view})
        finally:
            config._attn_implementation_internal = saved
        return (out.last_hidden_state,)


def _take(output: torch.Tensor, kept: slice | torch.Tensor, copy: bool = True) -> torch.Tensor:
    """The kept positions of a step's output [R, W, ...]; in memory of their own unless `copy` is off
    (then read them before the step's next run, which overwrites its outputs)."""
    flat = output.flatten(0, 1)
    if isinstance(kept, torch.Tensor):
        return flat.index_select(0, kept)
    return flat[kept].clone() if copy else flat[kept]


def read_bucket(live: int) -> int:
    """The positions attention reads for rows ending by `live`: the power of two covering it or three
    quarters of it (at most a third past the live length), at least MIN_READ."""
    power = 1 << max(live - 1, 1).bit_length()
    three_quarters = power * 3 // 4
    return max(MIN_READ, three_quarters if live <= three_quarters else power)


def step_shape(highest_slot: int, widest: int, live: int, slots: int, length: int) -> tuple[int, int, int]:
    """The (rows, width, read) step of a forward (a width past `WIDTHS` is its own, uncaptured)."""
    rows = min(grown_slots(highest_slot + 1), slots)
    width = next((w for w in WIDTHS if w >= widest), widest)
    return rows, width, min(read_bucket(live), length)


def warm_shapes(slots: int, length: int, shortest: int, longest: int) -> list[tuple[int, int, int]]:
    """Every (rows, width, read) step a cache of `slots` x `length` can run for `shortest` to `longest`
    positions; the longest plus one widest step (a verification may run a few past the budget)."""
    rows = [1 << k for k in range(slots.bit_length())]  # slots: a power of two
    low, high = read_bucket(shortest), read_bucket(longest + WIDTHS[-1])
    buckets = {MIN_READ} | {b for k in range(high.bit_length() + 1) for b in (1 << k, (3 << k) // 4) if b >= MIN_READ}
    reads = sorted({min(b, length) for b in buckets if low <= b <= high})
    return [(r, w, s) for r in rows for w in WIDTHS for s in reads]
