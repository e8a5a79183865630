"""Token sampling: greedy, or temperature with nucleus (top-p), from a seeded generator.

Draws happen on the host with the sampler's CPU generator, whatever device the model runs on, so
one seed gives the same tokens on CPU and GPU (a device generator's stream differs: docs/gpu.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rstitch.errors import ConfigError


@dataclass
class Sampler:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"decoding.temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"decoding.top_p must be a number in (0, 1], got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"decoding.seed must be an integer, got {self.seed!r}")
        self.generator = torch.Generator().manual_seed(int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(int(seed))

    def probs_from_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution actually sampled from (temperature and top-p applied); one-hot when greedy."""
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = _nucleus(probs, self.top_p)
        return probs

    def sample(self, dist) -> int:
        if self.greedy:
            return dist.argmax
        return self.sample_from(self.probs_from_logits(dist.logits))

    def sample_from(self, probs: torch.Tensor) -> int:
        """One index drawn from `probs` (any device) on the generator's device (the host)."""
        return int(torch.multinomial(probs.to(device=self.generator.device, dtype=torch.float32), 1,
                                     generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_p, order = probs.sort(descending=True)
    cumulative = sorted_p.cumsum(-1)
    drop = cumulative - sorted_p > top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)
