"""transformers' own `generate` on a pair's HF models, greedy, batch 1: the reference SpecDec is
checked against (token-identical outputs) and timed against (scripts/bench_specdec.py)."""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from rstitch.engines import ModelPair, ModelRunner
from rstitch.engines.hf import HFModelRunner
from rstitch.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def hf_assisted_generate(pair: ModelPair, prompt_ids: list[int], k: int, max_new_tokens: int) -> list[int]:
    """transformers' assisted generation, greedy, with exactly k draft tokens per block (no early stop)."""
    draft = hf_model(pair.slm)
    saved = copy.deepcopy(draft.generation_config)
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    try:
        return hf_greedy_generate(pair, prompt_ids, max_new_tokens, assistant_model=draft)
    finally:
        draft.generation_config = saved


def hf_model(runner: ModelRunner) -> PreTrainedModel:
    """The transformers model behind an HF-engine runner; other engines have none to generate with."""
    if not isinstance(runner, HFModelRunner):
        raise ConfigError(f"transformers' generate needs engine=hf; '{runner.name}' runs on {type(runner).__name__}")
    return runner.model


def hf_greedy_generate(pair: ModelPair, prompt_ids: list[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
    """The target alone, greedy (`kwargs`: further options of transformers' `generate`)."""
    eos = sorted(set(pair.llm.eos_token_ids) | set(pair.slm.eos_token_ids))
    target = hf_model(pair.llm)
    input_ids = torch.tensor([prompt_ids], device=target.device)
    with torch.inference_mode():
        # PreTrainedModel gets generate from a mixin the stubs do not resolve: Module.__getattr__ types it.
        out = target.generate(  # type: ignore[operator]
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=eos, pad_token_id=eos[0], **kwargs,
        )
    return out[0, len(prompt_ids):].tolist()
