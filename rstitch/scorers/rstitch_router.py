"""R-Stitch+'s router (R-Stitch appendix A.13; docs/rstitch-plus.md "Router"): reads the SLM's last
hidden state and picks SLM (0) or LLM (1). Algorithm 1 consults it only on the SLM's states, so it
has the SLM's input projection only. Inputs go through a parameter-free LayerNorm first, because
raw last hidden states carry a few huge-magnitude channels.
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

WEIGHTS_FILE = "router.safetensors"
CONFIG_FILE = "config.json"
SLM, LLM = 0, 1  # the router's actions


@dataclass(frozen=True)
class RouterConfig:
    slm_hidden: int
    llm_hidden: int
    width: int = 0  # 0 = the width rule (docs/rstitch-plus.md "Width rule")
    depth: int = 6

    def resolved(self) -> RouterConfig:
        width = self.width or max(16, round(max(self.slm_hidden, self.llm_hidden) / 80))
        return RouterConfig(self.slm_hidden, self.llm_hidden, width, self.depth)


class ResidualBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.linear(x))


class RStitchRouter(nn.Module):
    """`forward(hidden)` -> logits over (SLM, LLM) for last hidden states of the SLM."""

    def __init__(self, config: RouterConfig):
        super().__init__()
        self.config = config.resolved()
        width = self.config.width
        self.input = nn.Linear(self.config.slm_hidden, width)
        self.blocks = nn.Sequential(*[ResidualBlock(width) for _ in range(self.config.depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 2)

    def forward(self, hidden: torch.Tensor, source: int = SLM) -> torch.Tensor:
        if source != SLM:
            raise ValueError("the R-Stitch+ router reads SLM hidden states only (Algorithm 1)")
        x = F.layer_norm(hidden.float(), hidden.shape[-1:])
        return self.head(self.norm(self.blocks(self.input(x))))

    def log_probs(self, hidden: torch.Tensor, sources: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probabilities [N, 2] for a batch of SLM hidden states (rows may be zero-padded
        beyond the SLM's hidden size); `sources`, when given, must all be SLM."""
        if sources is not None and bool((sources != SLM).any()):
            raise ValueError("the R-Stitch+ router reads SLM hidden states only (Algorithm 1)")
        return torch.log_softmax(self(hidden[:, : self.config.slm_hidden]), dim=-1)

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
    # Older checkpoints' `inputs.0.*` (the SLM's projection) load as `input.*`, without `inputs.1.*` (the
    # LLM's, never read under Algorithm 1).
    state = {("input." + k.removeprefix("inputs.0.") if k.startswith("inputs.0.") else k): v
             for k, v in load_file(directory / WEIGHTS_FILE).items() if not k.startswith("inputs.1.")}
    router.load_state_dict(state)
    return router.eval()


def router_metadata(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / CONFIG_FILE).read_text()).get("metadata", {})
