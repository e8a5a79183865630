"""Transformer PRMs: a backbone, a scoring head, and one reward read per step at a marker token.
(The testbed PRM, a causal LM read through its own predictions, is `likelihood_prm`.)

* `SkyworkPRM` (Skywork-o1-Open-PRM-Qwen-2.5-1.5B / -7B): the checkpoint is a Qwen2 causal LM
  plus a value head (``v_head.summary.weight`` [1, H] and ``v_head.summary.bias`` [1]) that
  Skywork's own code attaches. We load the Qwen2 backbone with `AutoModel` (the ``lm_head`` is
  not needed) and rebuild the value head as a `Linear(H, 1)` from those two tensors. Input as in
  the RSD code: ``bos + problem + "\\n"``, then each step's tokens followed by the last token of
  the separator; reward = sigmoid of the value at that separator token.
* `QwenMathPRM` (Qwen2.5-Math-PRM-7B, remote code): chat template [system, user: problem,
  assistant: steps each followed by ``<extra_0>``]; reward = softmax of the two-class head at each
  ``<extra_0>``, probability of class 1 (the step is correct).
"""
from __future__ import annotations

import json
import os
from abc import abstractmethod
from collections.abc import Sequence

import torch

from rstitch.engines.base import check_hub_model, resolve_model_path, warn_remote_code
from rstitch.errors import ConfigError
from rstitch.rewards.base import ProcessRewardModel
from rstitch.rewards.prefix_cache import PrefixCachedHead

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_STEP_TOKEN = "<extra_0>"
SKYWORK_VALUE_HEAD = ("v_head.summary.weight", "v_head.summary.bias")


class HFProcessRewardModel(ProcessRewardModel):
    """Scores = `reward(head(backbone(ids)))` at one position per step (see `encode`)."""

    def __init__(self, name: str, tokenizer, backbone: torch.nn.Module, head: torch.nn.Module, use_cache: bool = True):
        super().__init__()
        self.name = name
        self.tokenizer = tokenizer
        self.scorer = PrefixCachedHead(backbone.eval(), head.eval(), self.cost, use_cache)
        self.num_parameters = _count(backbone) + _count(head)

    @abstractmethod
    def encode(self, problem: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        """Input ids and, per step, the position whose head output is the step's reward."""

    @abstractmethod
    def reward(self, rows: torch.Tensor) -> torch.Tensor:
        """Head outputs [n_steps, k] -> rewards [n_steps] in [0, 1]."""

    def score(self, problem: str, steps: Sequence[str]) -> list[float]:
        if not steps:
            return []
        ids, positions = self.encode(problem, steps)
        rows = self.scorer.rows(ids)[positions]
        return [float(r) for r in self.reward(rows)]

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


class SkyworkPRM(HFProcessRewardModel):
    def __init__(self, path: str, device: str = "cpu", dtype: str = "bfloat16", separator: str = "\n\n"):
        backbone, tokenizer = _load(path, "AutoModel", device, dtype)
        head = _value_head(path, backbone.config.hidden_size).to(device=backbone.device, dtype=backbone.dtype)
        super().__init__("skywork", tokenizer, backbone, head)
        self.separator_id = self._ids(separator)[-1]

    def encode(self, problem: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        ids = self._ids((self.tokenizer.bos_token or "") + problem + "\n")
        positions = []
        for step in steps:
            ids += (self._ids(step) if step else []) + [self.separator_id]
            positions.append(len(ids) - 1)
        return ids, positions

    def reward(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(rows[:, 0])


class QwenMathPRM(HFProcessRewardModel):
    def __init__(
        self,
        path: str,
        device: str = "cpu",
        dtype: str = "bfloat16",
        system: str = QWEN_MATH_SYSTEM,
        auto_class: str = "AutoModel",
        trust_remote_code: bool = False,  # its config sets it: the checkpoint ships its own model code
        use_cache: bool = False,  # its remote code predates cache objects; rerun the input
        revision: str | None = None,
        use_safetensors: bool = True,
    ):
        model, tokenizer = _load(path, auto_class, device, dtype, trust_remote_code, revision, use_safetensors)
        super().__init__("qwen_math_prm", tokenizer, getattr(model, model.base_model_prefix), model.score, use_cache)
        self.system = system
        self.step_id = tokenizer.convert_tokens_to_ids(QWEN_STEP_TOKEN)
        if self.step_id is None or self.step_id == tokenizer.unk_token_id:
            raise ConfigError(f"PRM '{path}': tokenizer has no {QWEN_STEP_TOKEN} token")

    def encode(self, problem: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": problem},
            {"role": "assistant", "content": "".join(step + QWEN_STEP_TOKEN for step in steps)},
        ]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        ids = self._ids(text)
        positions = [i for i, t in enumerate(ids) if t == self.step_id]
        if len(positions) != len(steps):  # a step containing the marker itself would shift rewards
            raise ValueError(f"expected {len(steps)} {QWEN_STEP_TOKEN} markers, found {len(positions)}")
        return ids, positions

    def reward(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.softmax(rows, dim=-1)[:, 1]


def _load(path: str, auto_class: str, device: str, dtype: str, trust_remote_code: bool = False,
          revision: str | None = None, use_safetensors: bool = True):
    import transformers

    if dtype not in DTYPES:
        raise ConfigError(f"unknown PRM dtype '{dtype}'; valid: {', '.join(DTYPES)}")
    path = resolve_model_path(path)
    if not os.path.isdir(path):
        check_hub_model(path, revision)
    if trust_remote_code:
        warn_remote_code(path)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, revision=revision)
        model = getattr(transformers, auto_class).from_pretrained(
            path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, revision=revision,
            use_safetensors=use_safetensors,
        )
    except OSError as err:  # hub id unreachable offline, or a directory without a model
        raise ConfigError(f"cannot load PRM '{path}': {str(err).splitlines()[0]}") from None
    return model.to(device).eval(), tokenizer


def _value_head(path: str, hidden_size: int) -> torch.nn.Linear:
    """Skywork's value head, read from whichever checkpoint shard holds it."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    index = cached_file(path, "model.safetensors.index.json", _raise_exceptions_for_missing_entries=False)
    if index:
        with open(index) as f:
            shard = json.load(f)["weight_map"].get(SKYWORK_VALUE_HEAD[0])
    else:
        shard = "model.safetensors"
    shard_path = cached_file(path, shard, _raise_exceptions_for_missing_entries=False) if shard else None
    if not shard_path:
        raise ConfigError(f"PRM '{path}' has no value head ({SKYWORK_VALUE_HEAD[0]}) in its safetensors")
    with safe_open(shard_path, framework="pt") as f:
        if SKYWORK_VALUE_HEAD[0] not in f.keys():
            raise ConfigError(f"PRM '{path}' has no value head ({SKYWORK_VALUE_HEAD[0]}) in its safetensors")
        weight, bias = (f.get_tensor(k) for k in SKYWORK_VALUE_HEAD)
    head = torch.nn.Linear(hidden_size, 1)
    with torch.no_grad():
        head.weight.copy_(weight.reshape(1, hidden_size))
        head.bias.copy_(bias.reshape(1))
    return head


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
