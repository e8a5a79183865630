"""Hugging Face transformers backend (CPU or GPU): one DynamicCache per sequence at batch size 1;
in batched runs one slot per sequence in a shared cache (`SlotCache`), and one padded forward for
the sequences waiting on a model."""
from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers.cache_utils import Cache

from rstitch.engines.base import (
    DTYPES,  # noqa: F401 (re-exported: the one table lives in engines/base.py)
    Capabilities,
    ConformanceEntry,
    EngineIdentity,
    ForwardRequest,
    ModelRunner,
    Sequence,
    default_torch_threads,
    resolve_model_path,
    torch_dtype,
)
from rstitch.engines.hf_forward import KVBuffers, ViewLayer, attention_implementation, attention_mask, cache_kwargs, compiled_path, forward_by_width
from rstitch.engines.hf_static import STATIC_MODEL_TYPES, StaticDecoder, StaticSequence, check_static_memory, resolve_mode
from rstitch.engines.loading import (
    eos_token_ids,
    load_config,
    load_tokenizer,
    model_load_errors,
    model_name,
    run_model_specs,
    shared_vocab_size,
)
from rstitch.errors import ConfigError

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel

log = logging.getLogger("rstitch")
CAUSAL_LM = "AutoModelForCausalLM"


class HFSequence(Sequence):
    runner: HFModelRunner

    def __init__(self, runner: HFModelRunner, prompt_ids: Seq[int], want_hidden: bool = False):
        super().__init__(runner, prompt_ids, want_hidden)
        from transformers import DynamicCache

        self.cache: DynamicCache | None = DynamicCache(config=runner.model.config)  # None once batched
        self.slot: int | None = None  # the row of the runner's SlotCache, once batched

    @torch.inference_mode()
    def _forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        runner = self.runner
        if self.slot is not None:  # batched before: its state lives in the slot
            return batched_forward(runner, [ForwardRequest(runner, self, new_ids, keep)])[0]
        if not runner.causal_lm:
            return self._head_forward(new_ids, keep)
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=runner.device)
        out = runner.model(
            input_ids=input_ids,
            use_cache=True,
            **cache_kwargs(runner.model, self.cache),
            logits_to_keep=keep,
            output_hidden_states=self.want_hidden,
        )
        logits = out.logits[0, -keep:, : runner.vocab_size].float()
        hidden = out.hidden_states[-1][0, -keep:].float() if self.want_hidden else None
        return logits, hidden

    def _head_forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A model of another auto class (a PRM's, a router's): its backbone, then its own head
        (`output_head`, none for a bare backbone) on the final hidden states, whose rows stand for logits."""
        runner = self.runner
        base = runner.model.base_model
        ids = new_ids if runner.use_cache else self.tokens[: self.n_cached] + new_ids
        cache = cache_kwargs(base, self.cache) if runner.use_cache else {}
        out = base(input_ids=torch.tensor([ids], dtype=torch.long, device=runner.device), use_cache=runner.use_cache, **cache)
        final = out.last_hidden_state[0, -keep:]
        head = runner.output_head
        rows = final if head is None else head(final.to(next(head.parameters()).dtype))
        return rows[:, : runner.vocab_size].float(), final.float() if self.want_hidden else None

    def _crop(self, n_keep: int) -> None:
        if self.slot is not None:
            return  # a slot's valid length is n_cached: the base class lowers it
        assert self.cache is not None, "a sequence without a slot keeps its DynamicCache"
        excess = self.cache.get_seq_length() - n_keep
        if excess > 0:
            self.cache.crop(-excess)


class HFModelRunner(ModelRunner):
    checkpoint_heads = True  # `auto_class` and remote code: a PRM's value head, a router's classifier
    unnamed_profiles = True  # the one engine before engines were named
    conformance = (
        ConformanceEntry("hf-eager-cpu", {"attn_implementation": "eager", "dtype": "float32", "device": "cpu"}),
        ConformanceEntry("hf-static-cpu", {"attn_implementation": "eager", "dtype": "float32", "device": "cpu", "compile": "static"}),
    )

    @classmethod
    def check_device(cls, pair_cfg: Mapping[str, Any]) -> None:
        """A CUDA pair on a torch without CUDA: one line naming the setting, before any model loads."""
        device = str(pair_cfg.get("device", "cpu"))
        if device.startswith("cuda") and not torch.cuda.is_available():
            reason = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA device is visible"
            raise ConfigError(f"pair '{pair_cfg.get('name')}' runs on device '{device}', but {reason}; "
                              "set pair.device=cpu (with pair.dtype=float32 on a CPU) or install a CUDA build of torch")

    @classmethod
    def default_threads(cls, options: Mapping[str, Any], device: str, largest_model_parameters: int,
                        cpus: int) -> int | None:
        """`num_threads: null`: threads that do not oversubscribe the CPUs (one for small models and on a GPU)."""
        if options.get("num_threads") is not None:
            return None
        return default_torch_threads(device, largest_model_parameters, cpus, torch.get_num_threads())

    @classmethod
    def scoring_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The eager path for a model that is not a causal LM keeping a KV cache: the static decoder serves only those."""
        causal_lm = options.get("auto_class", CAUSAL_LM) == CAUSAL_LM and options.get("use_cache", True) is not False
        return options if causal_lm else {**options, "compile": "off"}

    @classmethod
    def decode_path_key(cls, options: Mapping[str, Any], device: str) -> str | None:
        """The path `compile` resolves to; the eager path keeps the key runs had before the knob existed."""
        path = compiled_path(options.get("compile", "auto"), device)
        return None if path == "off" else path

    def __init__(
        self,
        path: str,
        name: str | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        tokenizer=None,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        num_threads: int | None = None,
        revision: str | None = None,  # a hub commit to pin (null: the default branch)
        use_safetensors: bool = True,  # false also loads pickled (.bin) weights, which can run code
        gguf_file: str | None = None,  # a GGUF file in `path`, dequantized to `dtype` at every load
        compile: Any = "auto",  # noqa: A002 - engine.compile: the static decode path (engines/hf_static.py)
        auto_class: str = CAUSAL_LM,  # another transformers auto class: a scoring model (PRM, router) read through its own head
        use_cache: bool = True,  # false: every forward reruns the whole sequence (remote code without cache objects)
    ):
        super().__init__()
        from transformers.utils import logging as hf_logging

        torch_dtype(dtype)  # one line for an unknown name, before anything loads
        self.path = path  # as configured (a packaged:<name> stays one)
        path = resolve_model_path(path)
        if trust_remote_code:  # the checkpoint repository's Python runs in this process: say so
            log.warning("trust_remote_code is set for '%s': its repository's code runs in this process", path)
        if num_threads:  # small models on a shared CPU run far faster on one thread than on two
            torch.set_num_threads(int(num_threads))
        hf_logging.disable_progress_bar()  # per-shard bars would bury the run's own output
        self.name = model_name(path, name)
        self.device = torch.device(device)
        self.dtype = dtype
        with model_load_errors(path):  # a gguf_file's tokenizer is rebuilt at every load (packaged: once)
            self.tokenizer = load_tokenizer(path, tokenizer, trust_remote_code=trust_remote_code, revision=revision,
                                            gguf_file=gguf_file)
            self.model = load_causal_lm(path, dtype, device, trust_remote_code=trust_remote_code, revision=revision,
                                        use_safetensors=use_safetensors, gguf_file=gguf_file,
                                        attn_implementation=attn_implementation, auto_class=auto_class)
        self.causal_lm, self.use_cache = auto_class == CAUSAL_LM, use_cache
        self.output_head = output_head(self.model, auto_class)
        self.vocab_size = shared_vocab_size(self.tokenizer, self.model.config.vocab_size)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.hidden_size = self.model.config.hidden_size
        self.eos_token_ids = eos_token_ids(self.tokenizer, getattr(getattr(self.model, "generation_config", None), "eos_token_id", None))
        # Other model types run a batch's rows one by one: same results, no gain.
        config = self.model.config
        batchable = config.model_type in STATIC_MODEL_TYPES and attention_implementation(config) in ("sdpa", "eager")
        self.capabilities = Capabilities(hidden_states=True, batched_forward=self.causal_lm and batchable)
        self._slots: SlotCache | None = None  # made at the first batched forward
        mode = resolve_mode(compile, self.device)
        # Latency profiles are keyed by the identity: a captured or compiled path's forwards are
        # profiled apart from the eager path's (`static`, the uncaptured CPU test path, shares them).
        engine = f"hf-{mode}" if mode in ("graphs", "inductor") else "hf"
        self.identity = EngineIdentity(engine, self.name, self.device.type, dtype)
        self.static = None if mode == "off" else StaticDecoder(self, mode)

    def new_sequence(self, prompt_ids: Seq[int], want_hidden: bool = False) -> Sequence:
        if self.static is not None:
            return StaticSequence(self, prompt_ids, want_hidden)
        return HFSequence(self, prompt_ids, want_hidden)

    def forward_batch(self, requests: list[ForwardRequest]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        if self.static is not None:
            return forward_by_width(requests, self.static.forward)
        if not self.capabilities.batched_forward:
            return super().forward_batch(requests)
        if self._slots is None:
            self._slots = SlotCache(self.model.config, self.model.dtype, self.device)
        return forward_by_width(requests, partial(batched_forward, self))

    def prepare_shapes(self, batch_size: int, shortest: int, longest: int) -> None:
        """Capture every step shape the run can use (`StaticDecoder.warm_up`)."""
        if self.static is not None:
            self.static.warm_up(batch_size, shortest, longest)

    def elapsed_since(self, start: float) -> float:
        """Wall time since `start`, less the static path's one-off capturing or compiling in it."""
        self.synchronize()
        seconds = time.perf_counter() - start
        return seconds - self.static.capture_seconds_since(start) if self.static is not None else seconds

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @staticmethod
    def check_memory(pair_cfg: dict[str, Any], engine_cfg: dict[str, Any], batch_size: int,
                     longest_prompt: Callable[[Any], int], max_new_tokens: int) -> None:
        """On CUDA, `check_static_memory` for the run's longest sample (local models; hub ones at each resize)."""
        device = torch.device(pair_cfg.get("device", "cpu"))
        if device.type != "cuda":
            return
        specs = run_model_specs(pair_cfg, engine_cfg)
        paths = {role: resolve_model_path(spec["path"]) for role, spec in specs.items()}
        static = {role: resolve_mode(spec.get("compile", "auto"), device) != "off" for role, spec in specs.items()}
        if not any(static.values()) or not all(os.path.isdir(path) for path in paths.values()):
            return
        models, contexts = {}, []
        for role, spec in specs.items():
            options = {k: spec.get(k) for k in ("trust_remote_code", "revision", "gguf_file")}
            with model_load_errors(paths[role]):
                config = load_config(paths[role], **options)
            models[model_name(paths[role], spec.get("name"))] = (config, torch_dtype(spec["dtype"]), static[role])
            contexts.append(getattr(config, "max_position_embeddings", None) or sys.maxsize)
        llm = specs["llm"]
        with model_load_errors(paths["llm"]):
            tokenizer = load_tokenizer(paths["llm"], llm.get("tokenizer"), trust_remote_code=llm.get("trust_remote_code"),
                                       revision=llm.get("revision"), gguf_file=llm.get("gguf_file"))
        positions = min(longest_prompt(tokenizer) + max_new_tokens, *contexts)
        gc.collect()  # a dropped pair's runners and decoders refer to each other
        # what the device has free, plus what torch's allocator holds unused (a dropped pair's)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        check_static_memory(models, batch_size, positions, torch.cuda.mem_get_info(device)[0] + cached)


class SlotCache(KVBuffers):
    """The eager path's batched cache. A slot's valid length is its sequence's `n_cached`, so a rollback moves no data."""

    INITIAL = (8, 256)  # slots, positions; both double when outgrown

    def __init__(self, config: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(config, dtype, device, *self.INITIAL)


class _SlotLayer(ViewLayer):
    """One layer of a batched forward's cache: each row's new keys go after its cached positions; every row's
    keys come back padded to the longest (the 4D mask hides the rest), in place when the slots form a range."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, span: slice | None,
                 positions: torch.Tensor, read: int):
        super().__init__(read)
        self.keys, self.values, self.rows, self.span, self.positions = keys, values, rows, span, positions
        self.stores = (keys, values)  # typed as given (the mixin declares keys and values optional)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for store, new in zip(self.stores, (key_states, value_states)):
            store[self.rows[:, None], :, self.positions] = new.transpose(1, 2)
            window = store[:, :, : self.read]
            out.append(window[self.span] if self.span is not None else window.index_select(0, self.rows))
        return out[0], out[1]


@torch.inference_mode()
def batched_forward(runner: HFModelRunner, requests: list[ForwardRequest]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """One padded forward, each row at its own slot's positions n_cached..; its last `keep` rows out."""
    cache, model = runner._slots, runner.model
    assert cache is not None, "forward_batch makes the SlotCache before the first batched forward"
    # An HFModelRunner's requests carry its own sequences, HFSequences.
    slots = [_slot(runner, cast(HFSequence, r.seq)) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: slots[i])  # in place when the slots are a range
    if order != list(range(len(requests))):
        results = batched_forward(runner, [requests[i] for i in order])
        return [results[order.index(i)] for i in range(len(requests))]
    seqs = [r.seq for r in requests]
    starts = [s.n_cached for s in seqs]
    width = max(len(r.new_ids) for r in requests)
    cache.make_room(max(starts) + width)
    rows = torch.tensor(slots, device=runner.device)
    span = slice(slots[0], slots[-1] + 1) if slots == list(range(slots[0], slots[-1] + 1)) else None
    positions = torch.tensor(starts, device=runner.device)[:, None] + torch.arange(width, device=runner.device)
    read = max(starts) + width
    view = Cache(layers=[_SlotLayer(k, v, rows, span, positions, read) for k, v in zip(cache.keys, cache.values)])
    ids = torch.zeros((len(requests), width), dtype=torch.long, device=runner.device)
    for row, r in enumerate(requests):
        ids[row, : len(r.new_ids)] = torch.tensor(r.new_ids, dtype=torch.long)
    # Query j of a row sees its positions up to start + j (padding queries too: no row is all masked).
    allowed = torch.arange(read, device=runner.device)[None, None, :] <= positions[:, :, None]
    mask = attention_mask(allowed, attention_implementation(model.config), model.dtype)
    base = getattr(model, model.base_model_prefix)
    out = base(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache_kwargs(base, view))
    index = torch.tensor([row * width + i for row, r in enumerate(requests)
                          for i in range(len(r.new_ids) - r.keep, len(r.new_ids))], device=runner.device)
    # The final (normed) hidden states: what `hidden_states[-1]` of a causal LM's forward holds.
    final = out.last_hidden_state.flatten(0, 1)[index]
    keeps = [r.keep for r in requests]
    logits = model.get_output_embeddings()(final)[:, : runner.vocab_size].float().split(keeps)
    hidden = final.float().split(keeps)
    return [(lg, h if s.want_hidden else None) for lg, h, s in zip(logits, hidden, seqs)]


def _slot(runner: HFModelRunner, seq: HFSequence) -> int:
    """`seq`'s slot, taken at its first batched forward (its DynamicCache's entries copied there)."""
    if seq.slot is None:
        cache = runner._slots
        assert cache is not None and seq.cache is not None, "the SlotCache exists; an unslotted sequence has its cache"
        seq.slot = cache.acquire()
        weakref.finalize(seq, cache.release, seq.slot)
        if seq.n_cached:
            cache.make_room(seq.n_cached)
            # A DynamicCache's layers are DynamicLayers, filled up to n_cached; the stubs give the union of all layer kinds.
            for layer, stored in enumerate(seq.cache.layers):
                cache.keys[layer][seq.slot, :, : seq.n_cached] = stored.keys[0, :, : seq.n_cached]  # type: ignore[union-attr,index]
                cache.values[layer][seq.slot, :, : seq.n_cached] = stored.values[0, :, : seq.n_cached]  # type: ignore[union-attr,index]
        seq.cache = None  # the slot holds its state from now on
    return seq.slot


def output_head(model: PreTrainedModel, auto_class: str) -> torch.nn.Module | None:
    """What turns final hidden states into outputs: the LM head, a `score` or `classifier` head, or None."""
    if auto_class == CAUSAL_LM:
        return model.get_output_embeddings()
    head = next((h for h in (getattr(model, "score", None), getattr(model, "classifier", None)) if h is not None), None)
    if head is None and model.base_model is not model:
        raise ConfigError(f"engine 'hf': a {type(model).__name__} ({auto_class}) has no score or classifier head to read")
    return head


_WEIGHTS: weakref.WeakValueDictionary[str, PreTrainedModel] = weakref.WeakValueDictionary()


def load_causal_lm(path: str, dtype: str, device: str, *, trust_remote_code: bool = False, revision: str | None = None,
                   use_safetensors: bool = True, gguf_file: str | None = None,
                   attn_implementation: str | None = None, auto_class: str = CAUSAL_LM) -> PreTrainedModel:
    """A causal LM (or another transformers `auto_class`) in eval mode, shared while in use: a judge
    PRM on the pair's own LLM reads the same weights (every user keeps its own KV caches)."""
    import transformers

    model_class = getattr(transformers, auto_class, None) if auto_class.startswith("AutoModel") else None
    if model_class is None:
        raise ConfigError(f"engine 'hf': unknown auto_class '{auto_class}' (a transformers AutoModel... class)")
    options = {"trust_remote_code": trust_remote_code, "revision": revision, "attn_implementation": attn_implementation}
    # A GGUF file is its own format: the safetensors-only rule is for checkpoint directories.
    options.update({"gguf_file": gguf_file} if gguf_file else {"use_safetensors": use_safetensors})
    options = {k: v for k, v in options.items() if v is not None}
    key = json.dumps([path, dtype, str(device), options, auto_class], sort_keys=True)
    model = _WEIGHTS.get(key)
    if model is None:
        model = model_class.from_pretrained(path, dtype=torch_dtype(dtype), **options).to(device).eval()
        _WEIGHTS[key] = model
    return model


RUNNER = HFModelRunner  # the class engines.ENGINES registers for conf/engine/hf.yaml
