"""Arbitrage's router: a sequence classifier predicting P(delta > 0), delta = PRM(target step) -
PRM(draft step) (Arbitrage §4.2). Input: the problem, every earlier step tagged with the model that
wrote it (§6.2: 0 = draft, 1 = target), then the draft step; the prediction is class 1 of its
num_labels=2 head at the last token. Pieces are tokenized one by one so a decision's input is a
prefix of the next one, whose KV cache `PrefixCachedScorer` reuses.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from rstitch.engines import load_scoring_model, require_engine
from rstitch.engines.base import torch_dtype
from rstitch.engines.loading import load_config, model_load_errors
from rstitch.errors import ConfigError
from rstitch.scorers.prefix_cache import PrefixCachedScorer

DRAFT_AUTHOR, TARGET_AUTHOR = 0, 1


def router_pieces(problem: str, history: Sequence[tuple[int, str]], draft: str, separator: str = "\n\n") -> list[str]:
    """The router input as text pieces; `history` is [(author, step text), ...]."""
    steps = [*history, (DRAFT_AUTHOR, draft)]
    return [problem + "\n"] + [f"Model {author}: {text}{separator}" for author, text in steps]


def encode_router_input(tokenizer, problem: str, history: Sequence[tuple[int, str]], draft: str, separator: str = "\n\n") -> list[int]:
    return [t for piece in router_pieces(problem, history, draft, separator) for t in tokenizer.encode(piece, add_special_tokens=False)]


class ArbitrageRouter:
    def __init__(self, path: str | None = None, device: str = "cpu", dtype: str = "float32", separator: str = "\n\n",
                 engine: str | None = None):
        if not path:  # the testbed's router comes from the config too (conf/method/arbitrage.yaml)
            raise ConfigError("no Arbitrage router path: set method.router.path (train one with scripts/train_arbitrage_router.py)")
        if not os.path.isdir(path) and os.path.isabs(path):
            raise ConfigError(f"Arbitrage router not found at {path}; train it with scripts/train_arbitrage_router.py")
        torch_dtype(dtype, "router")
        require_engine(engine, "checkpoint_heads", "the Arbitrage router reads a sequence-classification head")
        with model_load_errors(path):
            num_labels = load_config(path).num_labels
        if num_labels != 2:
            raise ConfigError(f"Arbitrage router '{path}' must have num_labels=2, has {num_labels}")
        runner = load_scoring_model(engine, path, "the Arbitrage router", dtype=dtype, device=device,
                                    auto_class="AutoModelForSequenceClassification")
        self.separator, self.tokenizer = separator, runner.tokenizer
        self.cost, self.num_parameters = runner.cost, runner.num_parameters
        self.scorer = PrefixCachedScorer(runner)

    def predict(self, problem: str, history: Sequence[tuple[int, str]], draft: str) -> float:
        """y_hat = P(the target model's step would score higher than `draft`)."""
        ids = encode_router_input(self.tokenizer, problem, history, draft, self.separator)
        logits = self.scorer.rows(ids)[-1]  # every new position, as the classifier always ran (bit for bit)
        return float(torch.softmax(logits, dim=-1)[1])
