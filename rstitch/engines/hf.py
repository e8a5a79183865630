"""Hugging Face transformers backend (CPU or GPU): one DynamicCache per sequence."""
from __future__ import annotations

import json
import os
import time
import weakref
from typing import Sequence as Seq

import torch

from rstitch.engines.base import ModelRunner, Sequence, resolve_model_path, warn_remote_code
from rstitch.errors import ConfigError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class HFSequence(Sequence):
    runner: "HFModelRunner"

    def __init__(self, runner: "HFModelRunner", prompt_ids: Seq[int], want_hidden: bool = False):
        super().__init__(runner, prompt_ids, want_hidden)
        from transformers import DynamicCache

        self.cache = DynamicCache(config=runner.model.config)

    @torch.inference_mode()
    def _forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        runner = self.runner
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=runner.device)
        out = runner.model(
            input_ids=input_ids,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=keep,
            output_hidden_states=self.want_hidden,
        )
        logits = out.logits[0, -keep:, : runner.vocab_size].float()
        hidden = out.hidden_states[-1][0, -keep:].float() if self.want_hidden else None
        return logits, hidden

    def _crop(self, n_keep: int) -> None:
        excess = self.cache.get_seq_length() - n_keep
        if excess > 0:
            self.cache.crop(-excess)


class HFModelRunner(ModelRunner):
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
    ):
        super().__init__()
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype '{dtype}'; valid: {', '.join(DTYPES)}")
        self.path = path  # as configured (a packaged:<name> stays one)
        path = resolve_model_path(path)
        if trust_remote_code:
            warn_remote_code(path)
        if num_threads:  # small models on a shared CPU run far faster on one thread than on two
            torch.set_num_threads(int(num_threads))
        hf_logging.disable_progress_bar()  # per-shard bars would bury the run's own output
        self.name = name or os.path.basename(path.rstrip("/"))
        self.device = torch.device(device)
        self.dtype = dtype
        try:
            # gguf_file: the tokenizer is rebuilt from the GGUF vocabulary at every load (slow);
            # packaged models are converted once instead (engines/packaged.py)
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(
                path, trust_remote_code=trust_remote_code, revision=revision, **({"gguf_file": gguf_file} if gguf_file else {}))
            self.model = load_causal_lm(path, dtype, device, trust_remote_code=trust_remote_code, revision=revision,
                                        use_safetensors=use_safetensors, gguf_file=gguf_file,
                                        attn_implementation=attn_implementation)
        except OSError as err:  # hub id unreachable offline, or a directory without (safetensors) weights
            raise ConfigError(f"cannot load model '{path}': {str(err).splitlines()[0]}") from None
        self.vocab_size = min(len(self.tokenizer), self.model.config.vocab_size)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.hidden_size = self.model.config.hidden_size
        self.eos_token_ids = _eos_ids(self.tokenizer, self.model)

    def new_sequence(self, prompt_ids: Seq[int], want_hidden: bool = False) -> HFSequence:
        return HFSequence(self, prompt_ids, want_hidden)

    def elapsed_since(self, start: float) -> float:
        self.synchronize()
        return time.perf_counter() - start

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


_WEIGHTS: "weakref.WeakValueDictionary[str, torch.nn.Module]" = weakref.WeakValueDictionary()


def load_causal_lm(path: str, dtype: str, device: str, *, trust_remote_code: bool = False, revision: str | None = None,
                   use_safetensors: bool = True, gguf_file: str | None = None,
                   attn_implementation: str | None = None) -> torch.nn.Module:
    """A causal LM in eval mode, shared while in use: a judge PRM on the pair's own LLM reads the
    same weights instead of a second copy (inference only; every user keeps its own KV caches)."""
    from transformers import AutoModelForCausalLM

    options = {"trust_remote_code": trust_remote_code, "revision": revision, "attn_implementation": attn_implementation}
    # A GGUF file is its own format: the safetensors-only rule is for checkpoint directories.
    options.update({"gguf_file": gguf_file} if gguf_file else {"use_safetensors": use_safetensors})
    options = {k: v for k, v in options.items() if v is not None}
    key = json.dumps([path, dtype, str(device), options], sort_keys=True)
    model = _WEIGHTS.get(key)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], **options).to(device).eval()
        _WEIGHTS[key] = model
    return model


def _eos_ids(tokenizer, model) -> list[int]:
    ids = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return sorted(ids)
