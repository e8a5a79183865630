"""R-Stitch+'s router: reads the active model's last hidden state and picks SLM (0) or LLM (1).

Architecture (per the paper): an input projection, 6 feed-forward blocks `x + GELU(W x + b)`,
a LayerNorm and a two-way linear head. The SLM and the LLM have different hidden sizes, so the
router has one input projection per model and shares the trunk and head: both ask the same
question ("is the next token hard?"), and sharing halves the data each part needs.

Width rule: `width = max(MIN_WIDTH, round(max(slm_hidden, llm_hidden) / WIDTH_DIVISOR))`. With
the paper's LLM hidden size 3584 this gives width 45 and ~0.17M parameters for the LLM input
projection plus the trunk (the projection dominates), +69K for a 1536-wide SLM's projection; the
testbed pair (hidden 64 / 112) hits the floor of 16 (4.5K parameters). Inputs go
through a parameter-free LayerNorm first, because raw last hidden states of LLMs carry a few
huge-magnitude channels.

A checkpoint is a directory: `router.safetensors` (weights) and `config.json` (sizes and any
training metadata).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

WIDTH_DIVISOR = 80
MIN_WIDTH = 16
DEPTH = 6
WEIGHTS_FILE = "router.safetensors"
CONFIG_FILE = "config.json"
SLM, LLM = 0, 1  # the router's actions and the index of its input projections


def router_width(slm_hidden: int, llm_hidden: int) -> int:
    return max(MIN_WIDTH, round(max(slm_hidden, llm_hidden) / WIDTH_DIVISOR))


@dataclass(frozen=True)
class RouterConfig:
    slm_hidden: int
    llm_hidden: int
    width: int = 0  # 0 = the width rule above
    depth: int = DEPTH

    def resolved(self) -> RouterConfig:
        width = self.width or router_width(self.slm_hidden, self.llm_hidden)
        return RouterConfig(self.slm_hidden, self.llm_hidden, width, self.depth)


class ResidualBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.linear(x))


class RStitchRouter(nn.Module):
    """`forward(hidden, source)` -> logits over (SLM, LLM) for hidden states of model `source`."""

    def __init__(self, config: RouterConfig):
        super().__init__()
        self.config = config.resolved()
        width = self.config.width
        self.inputs = nn.ModuleList([nn.Linear(self.config.slm_hidden, width), nn.Linear(self.config.llm_hidden, width)])
        self.blocks = nn.Sequential(*[ResidualBlock(width) for _ in range(self.config.depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 2)

    def forward(self, hidden: torch.Tensor, source: int) -> torch.Tensor:
        x = F.layer_norm(hidden.float(), hidden.shape[-1:])
        return self.head(self.norm(self.blocks(self.inputs[source](x))))

    def log_probs(self, hidden: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [N, 2] for a batch of hidden states from either model (zero-padded
        to the larger hidden size; `sources[i]` says whose state row i is)."""
        out = torch.empty(hidden.shape[0], 2)
        for source, size in ((SLM, self.config.slm_hidden), (LLM, self.config.llm_hidden)):
            rows = (sources == source).nonzero(as_tuple=True)[0]
            if len(rows):
                out = out.index_put((rows,), torch.log_softmax(self(hidden[rows, :size], source), dim=-1))
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def save_router(router: RStitchRouter, directory: str | Path, metadata: dict[str, Any] | None = None) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in router.state_dict().items()}, directory / WEIGHTS_FILE)
    config = {**asdict(router.config), "num_parameters": router.num_parameters(), "metadata": metadata or {}}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load_router(directory: str | Path) -> RStitchRouter:
    directory = Path(directory)
    config = json.loads((directory / CONFIG_FILE).read_text())
    fields = {k: config[k] for k in ("slm_hidden", "llm_hidden", "width", "depth")}
    router = RStitchRouter(RouterConfig(**fields))
    router.load_state_dict(load_file(directory / WEIGHTS_FILE))
    return router.eval()


def router_metadata(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / CONFIG_FILE).read_text()).get("metadata", {})
