"""The HF engine's static decode path (`engine.compile`): preallocated KV slots, forwards of a few
fixed shapes, and on CUDA those forwards replayed as CUDA graphs.

Why: on a GPU the eager path spends its time in Python and kernel launches, not in reading
weights (docs/gpu.md). Here every forward of a model has one of a few shapes, so it can be
captured once and replayed:

* KV cache: per layer one buffer [slots, kv heads, length, head dim] per model, allocated once
  (both dimensions double when outgrown, which drops the captured graphs). A sequence owns one
  slot while it lives; its valid length is its `n_cached`, so rollback lowers a number and moves
  no data, and batched runs (`batch_size` > 1) put their rows in the same slots. The last
  position of every slot is scratch: padding rows and columns write their keys there.
* Shapes: a forward runs rows [0, R) of the buffers, R a power of two covering the slots it
  serves, and a width W from `WIDTHS` covering its longest row (decode steps W = 1; catch-up
  prefills, speculative verification and step regeneration a bucket). Wider forwards (a prompt's
  prefill) run eagerly on the same buffers at their own width.
* One step computes, on the device, logits, log-probabilities, entropy and argmax of every
  position; the host then reads only the entropy and argmax of the positions kept, in one
  transfer per forward (greedy decoding needs nothing else; sampling copies the probabilities
  too, engines/sampling.py).
* Capture: `graphs` records each (R, W) step with torch.cuda.CUDAGraph on first use; `inductor`
  compiles it with torch.compile(mode="reduce-overhead") instead; `static` runs the same step
  without capture (any device: CPU tests check its invariants).

Outputs equal the eager path's up to floating-point rounding (attention reads the whole slot
under a mask instead of the cached prefix); tests/test_static_cache.py checks tokens on CPU.
"""
from __future__ import annotations

import heapq
import logging
import weakref
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch

from rstitch.configs import compiled_path
from rstitch.engines.base import ForwardRequest, Sequence, TokenDistribution
from rstitch.engines.hf_forward import cache_kwargs, kv_shape, width_groups
from rstitch.errors import ConfigError

if TYPE_CHECKING:
    from rstitch.engines.hf import HFModelRunner

log = logging.getLogger("rstitch")

MODES = ("auto", "off", "static", "graphs", "inductor")
WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)  # forward widths with their own captured step
# Steps of at most this many positions (rows x width) compute the head and the summaries of every
# position inside the step; wider ones only the hidden states, then the head on the kept positions
# (full-vocabulary logits of every position would cost 0.6 MB each in float32).
FULL_STEP_POSITIONS = 256
INITIAL_LENGTH = 2048  # positions per slot at first; doubles when outgrown
STATIC_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral"}  # lm_head(final norm) and a 4D mask


def resolve_mode(value: Any, device: torch.device) -> str:
    """`engine.compile` as one of off / static / graphs / inductor. auto: graphs on CUDA, off
    elsewhere (the CPU keeps the eager path); true: graphs; false: off."""
    if value not in (*MODES, True, False, None):
        raise ConfigError(f"engine.compile must be one of {', '.join(MODES)} (or true/false), got {value!r}")
    value = compiled_path(value, device.type)
    if value in ("graphs", "inductor") and device.type != "cuda":
        raise ConfigError(f"engine.compile={value} captures CUDA graphs and needs pair.device=cuda (got {device}); "
                          "engine.compile=static runs the same static-cache path without capture on any device")
    return value


def check_supported(model: Any, mode: str) -> None:
    config = model.config
    problem = None
    if config.model_type not in STATIC_MODEL_TYPES:
        problem = f"model type '{config.model_type}' (supported: {', '.join(sorted(STATIC_MODEL_TYPES))})"
    elif config._attn_implementation not in ("sdpa", "eager"):
        problem = f"attention '{config._attn_implementation}' (supported: sdpa, eager)"
    elif any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        problem = "sliding-window layers"
    if problem:
        raise ConfigError(f"engine.compile={mode}: the static decode path does not handle {problem}; use engine.compile=off")


class StaticSequence(Sequence):
    """A sequence whose keys and values live in one slot of its runner's `StaticDecoder`."""

    runner: HFModelRunner

    def __init__(self, runner: HFModelRunner, prompt_ids: Seq[int], want_hidden: bool = False):
        super().__init__(runner, prompt_ids, want_hidden)
        decoder = runner.static
        assert decoder is not None, "a runner opens static sequences only with its decoder"
        self.slot = decoder.acquire()
        weakref.finalize(self, decoder.release, self.slot)
        self._summaries: list[tuple[float, int]] = []  # (entropy, argmax) of each window row

    def _forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        decoder = self.runner.static
        assert decoder is not None
        return decoder.forward([ForwardRequest(self.runner, self, new_ids, keep)])[0]

    def _crop(self, n_keep: int) -> None:
        """Nothing moves: the slot's valid length is `n_cached`, which the base class lowers."""

    def _dist_at(self, position: int) -> TokenDistribution:
        assert self._window_logits is not None, "_ensure_processed fills the window before distributions are read"
        row = position - self._window_start
        hidden = None if self._window_hidden is None else self._window_hidden[row]
        entropy, argmax = self._summaries[row]
        return SummarizedDistribution(self._window_logits[row], hidden, entropy, argmax)


class SummarizedDistribution(TokenDistribution):
    """A distribution whose entropy and argmax were computed on the device with the forward and
    read in its one transfer: the decode loop's routing and greedy choice need no further sync."""

    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor | None, entropy: float, argmax: int):
        super().__init__(logits, hidden)
        self.__dict__["entropy"] = entropy  # the cached_property's slot
        self._argmax = argmax

    @property
    def argmax(self) -> int:
        return self._argmax


class StaticKV:
    """Keys and values of every slot: [slots, kv heads, length, head dim] per layer."""

    def __init__(self, config: Any, dtype: torch.dtype, device: torch.device):
        self.n_layers, self.heads, self.head_dim = kv_shape(config)
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.resize(1, INITIAL_LENGTH)

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]

    def resize(self, slots: int, length: int) -> None:
        """Grow to `slots` x `length`, keeping what is stored (new buffers: captured steps are stale)."""
        shape = (slots, self.heads, length, self.head_dim)
        for store in (self.keys, self.values):
            for layer in range(self.n_layers):
                grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if layer < len(store):
                    old = store[layer]
                    grown[: old.shape[0], :, : old.shape[2]] = old
                    store[layer] = grown
                else:
                    store.append(grown)


class _RowsView:
    """What the model's attention sees as its cache in one step: rows [0, R) of every layer's
    buffers, whole length; `update` writes the new keys at each row's positions."""

    def __init__(self, kv: StaticKV, rows: int, positions: torch.Tensor):
        self.kv, self.rows, self.positions = kv, rows, positions
        self.row_index = torch.arange(rows, device=positions.device)[:, None]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        out = []
        for store, new in ((self.kv.keys[layer_idx], key_states), (self.kv.values[layer_idx], value_states)):
            rows = store[: self.rows]
            rows[self.row_index, :, self.positions] = new.transpose(1, 2)
            out.append(rows)
        return out[0], out[1]


class _Step:
    """One (rows, width) forward over static input buffers: `ids` and `positions` [R, W] are
    filled in place before each call; `run()` returns the outputs (overwritten by the next run)."""

    def __init__(self, decoder: StaticDecoder, rows: int, width: int, capture: str):
        device = decoder.kv.device
        self.decoder, self.rows, self.width = decoder, rows, width
        self.ids = torch.zeros((rows, width), dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, width), dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.full = rows * width <= FULL_STEP_POSITIONS
        self.compute: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]] = (
            decoder.compute if self.full else decoder.hidden_only)
        if capture == "inductor":
            # Fixed addresses: the in-place writes into the buffers would otherwise count as
            # mutated inputs, for which the compiled step skips its CUDA graph (as HF's StaticCache marks its own).
            for buffer in (*decoder.kv.keys, *decoder.kv.values):
                torch._dynamo.mark_static_address(buffer)
            self.compute = torch.compile(self.compute, mode="reduce-overhead", dynamic=False)
        if capture in ("graphs", "inductor"):
            self.scratch()
            self._warm_up(capture)

    def scratch(self) -> None:
        """Every row and column writes to the scratch position (what padding does)."""
        self.ids.zero_()
        self.positions.fill_(self.decoder.kv.length - 1)

    def _warm_up(self, capture: str) -> None:
        stream = torch.cuda.Stream(self.ids.device)
        stream.wait_stream(torch.cuda.current_stream(self.ids.device))
        with torch.cuda.stream(stream):
            for _ in range(3 if capture == "inductor" else 2):  # inductor records its graph on a later call
                self.compute(self.ids, self.positions)
        torch.cuda.current_stream(self.ids.device).wait_stream(stream)
        if capture == "graphs":
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=self.decoder.pool):
                self.outputs = self.compute(self.ids, self.positions)

    def run(self) -> tuple[torch.Tensor, ...]:
        if self.graph is not None:
            self.graph.replay()
            assert self.outputs is not None
            return self.outputs
        return self.compute(self.ids, self.positions)


class StaticDecoder:
    """A runner's static slots and captured steps (see the module docstring)."""

    def __init__(self, runner: HFModelRunner, mode: str):
        check_supported(runner.model, mode)
        self.runner, self.mode = runner, mode
        self.model = runner.model
        self.base = getattr(self.model, self.model.base_model_prefix)
        self.head = self.model.get_output_embeddings()
        self.kv = StaticKV(self.model.config, self.model.dtype, runner.device)
        self.free = [0]
        self.steps: dict[tuple[int, int], _Step] = {}
        self.pool = torch.cuda.graph_pool_handle() if mode == "graphs" else None
        self.captured = 0  # steps captured or compiled so far (growth recaptures)

    # --- slots ------------------------------------------------------------------------
    def acquire(self) -> int:
        if not self.free:
            old = self.kv.slots
            self._resize(2 * old, self.kv.length)
            self.free = list(range(old, 2 * old))
        return heapq.heappop(self.free)  # the lowest free slot keeps forwards in few rows

    def release(self, slot: int) -> None:
        heapq.heappush(self.free, slot)

    def _resize(self, slots: int, length: int) -> None:
        log.info("static cache of %s: %d slots x %d positions", self.runner.name, slots, length)
        self.steps.clear()
        self.kv.resize(slots, length)

    # --- forwards ---------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, requests: list[ForwardRequest]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The requests' forwards (each a StaticSequence of this runner) in one step, or one
        per group of similar widths (hf.width_groups) when a long prefill meets decode steps."""

        outputs: list[Any] = [None] * len(requests)
        for group in width_groups([len(r.new_ids) for r in requests]):
            for i, out in zip(group, self._forward_group([requests[i] for i in group])):
                outputs[i] = out
        return outputs

    def _forward_group(self, requests: list[ForwardRequest]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        seqs = [r.seq for r in requests]
        slots = [s.slot for s in seqs if isinstance(s, StaticSequence)]
        assert len(slots) == len(seqs), "a static runner's sequences are StaticSequences"
        widest = max(len(r.new_ids) for r in requests)
        needed = max(s.n_cached for s in seqs) + widest + 1  # + the scratch position
        if needed > self.kv.length:
            self._resize(self.kv.slots, max(needed, 2 * self.kv.length))
        rows = min(1 << (max(slots)).bit_length(), self.kv.slots)
        width = next((w for w in WIDTHS if w >= widest), widest)
        step = self._step(rows, width)
        ids = torch.zeros((rows, width), dtype=torch.long)
        positions = torch.full((rows, width), self.kv.length - 1, dtype=torch.long)  # padding: scratch
        for slot, r, s in zip(slots, requests, seqs):
            n = len(r.new_ids)
            ids[slot, :n] = torch.tensor(r.new_ids, dtype=torch.long)
            positions[slot, :n] = torch.arange(s.n_cached, s.n_cached + n)
        step.ids.copy_(ids)
        step.positions.copy_(positions)
        outputs = step.run()
        # the kept positions of each request, copied out of the step's (reused) outputs
        index = torch.tensor([slot * width + i for slot, r in zip(slots, requests)
                              for i in range(len(r.new_ids) - r.keep, len(r.new_ids))], device=self.kv.device)
        kept = [t.reshape(-1, *t.shape[2:]).index_select(0, index) for t in outputs]
        kept_logits, entropy, argmax, hidden = kept if step.full else (*self.summarize(kept[0]), kept[0])
        summaries = torch.stack([entropy.double(), argmax.double()], dim=-1).tolist()  # the one sync
        want_hidden = any(s.want_hidden for s in seqs)
        kept_hidden = hidden.float() if want_hidden else None
        out, start = [], 0
        for r, s in zip(requests, seqs):
            assert isinstance(s, StaticSequence)
            s._summaries = [(e, int(a)) for e, a in summaries[start: start + r.keep]]
            h = kept_hidden[start: start + r.keep] if kept_hidden is not None and s.want_hidden else None
            out.append((kept_logits[start: start + r.keep], h))
            start += r.keep
        return out

    def _step(self, rows: int, width: int) -> _Step:
        if width not in WIDTHS:  # a wide prefill (a prompt) runs once: no capture, nothing kept
            return _Step(self, rows, width, "static")
        key = (rows, width)
        if key not in self.steps:
            self.steps[key] = _Step(self, rows, width, self.mode)
            self.captured += self.mode != "static"
        return self.steps[key]

    def compute(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step itself, device work only: the model over rows [0, R) with each row's new
        tokens at `positions` of its slot, then logits, entropy (nats) and argmax of every position."""
        [hidden] = self.hidden_only(ids, positions)
        return (*self.summarize(hidden), hidden)

    def summarize(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits (float32, cut to the shared vocabulary), entropy in nats and argmax at each position."""
        logits = self.head(hidden)[..., : self.runner.vocab_size].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = -(log_probs.exp() * log_probs).nan_to_num().sum(-1)
        return logits, entropy, logits.argmax(-1)

    def hidden_only(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor]:
        """The model's final hidden states [R, W, H] (its keys and values written to the slots)."""
        rows, width = ids.shape
        length = self.kv.length
        allowed = torch.arange(length, device=ids.device)[None, None, :] <= positions[:, :, None]
        if self.model.config._attn_implementation == "sdpa":
            mask = allowed[:, None]
        else:
            floor = torch.finfo(self.model.dtype).min
            mask = torch.zeros(allowed.shape, dtype=self.model.dtype, device=ids.device).masked_fill(~allowed, floor)[:, None]

        view = _RowsView(self.kv, rows, positions)
        out = self.base(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                        **cache_kwargs(self.base, view))
        return (out.last_hidden_state,)

