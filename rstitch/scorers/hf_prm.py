"""Transformer PRMs: a backbone, a scoring head, and one reward read per step at a marker token
(inputs and heads: docs/step-level.md "Process reward models"). Skywork's value head is rebuilt from
its checkpoint over a bare backbone; Qwen2.5-Math-PRM's head is the checkpoint's own module. Both
run through the engine interface and `PrefixCachedScorer`.
"""
from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Sequence

import torch

from rstitch.engines import ModelRunner, TokenDistribution, engine_class, load_scoring_model, require_engine
from rstitch.engines.base import torch_dtype
from rstitch.errors import ConfigError
from rstitch.scorers.prefix_cache import PrefixCachedScorer, logit_rows
from rstitch.scorers.prm import ProcessRewardModel

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_STEP_TOKEN = "<extra_0>"
SKYWORK_VALUE_HEAD = ("v_head.summary.weight", "v_head.summary.bias")


class HFProcessRewardModel(ProcessRewardModel):
    """Scores = `reward(read(distributions))` at one position per step (see `encode`), the
    distributions those of `runner`, an engine's model; its forwards are this PRM's cost."""

    def __init__(self, name: str, runner: ModelRunner, read: Callable[[list[TokenDistribution]], torch.Tensor] = logit_rows,
                 want_hidden: bool = False, use_cache: bool = True, extra_parameters: int = 0):
        super().__init__()
        self.name = name
        self.runner, self.tokenizer, self.cost = runner, runner.tokenizer, runner.cost
        self.scorer = PrefixCachedScorer(runner, read, want_hidden, use_cache)
        self.num_parameters = runner.num_parameters + extra_parameters

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
    def __init__(self, path: str, device: str = "cpu", dtype: str = "bfloat16", separator: str = "\n\n",
                 engine: str | None = None):
        # The bare backbone, where an engine loads a checkpoint's classes by name (`auto_class`).
        hf_only = {"auto_class": "AutoModel"} if engine_class(engine).checkpoint_heads else {}
        runner = load_scoring_model(engine, path, "PRM skywork (its value head reads hidden states)", ("hidden_states",),
                                    dtype=dtype, device=device, **hf_only)
        self.head = _value_head(path, runner.hidden_size).to(dtype=torch_dtype(dtype))
        super().__init__("skywork", runner, self._values, want_hidden=True, extra_parameters=sum(p.numel() for p in self.head.parameters()))
        self.separator_id = self._ids(separator)[-1]

    def encode(self, problem: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        ids = self._ids((self.tokenizer.bos_token or "") + problem + "\n")
        positions = []
        for step in steps:
            ids += (self._ids(step) if step else []) + [self.separator_id]
            positions.append(len(ids) - 1)
        return ids, positions

    @torch.inference_mode()
    def _values(self, dists: list[TokenDistribution]) -> torch.Tensor:
        """The value head on the last hidden states, on the device the engine gives them on."""
        hidden = torch.stack([d.hidden for d in dists if d.hidden is not None])
        self.head = self.head.to(hidden.device)
        return self.head(hidden.to(self.head.weight.dtype))

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
        engine: str | None = None,  # None: the default engine
    ):
        require_engine(engine, "checkpoint_heads", "PRM qwen_math_prm reads its checkpoint's own classification head")
        runner = load_scoring_model(engine, path, "PRM qwen_math_prm", dtype=dtype, device=device, auto_class=auto_class,
                                    trust_remote_code=trust_remote_code, use_cache=use_cache, revision=revision,
                                    use_safetensors=use_safetensors)
        super().__init__("qwen_math_prm", runner, use_cache=use_cache)
        self.system = system
        self.step_id = self.tokenizer.convert_tokens_to_ids(QWEN_STEP_TOKEN)
        if self.step_id is None or self.step_id == self.tokenizer.unk_token_id:
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
