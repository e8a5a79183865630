"""A PRM read off a causal LM's own predictions: the testbed PRM (docs/testbed.md "The PRM").

Only digits and operators are checked, each among the tokens of its kind, so one model rates
concise and verbose steps alike (its raw probability of a concise step's first digit is tiny
because it would have started with "Adding", not because the digit is wrong).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rstitch.engines import load_scoring_model
from rstitch.errors import ConfigError
from rstitch.scorers.prefix_cache import PrefixCachedScorer, logit_rows
from rstitch.scorers.prm import ProcessRewardModel

HEAD_FILE = "prm_head.json"
FEATURES = ("solution_min", "step_min")
DEFAULT_KINDS = {"digit": [str(d) for d in range(10)], "operator": ["+", "-", "*"]}


@dataclass
class LikelihoodHead:
    """What is checked and how two features become a score (the contents of ``prm_head.json``)."""

    weight: list[float] = field(default_factory=lambda: [1.0, 0.0])
    bias: float = 0.0
    kinds: dict[str, list[str]] = field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_KINDS.items()})
    variants: list[str] = field(default_factory=lambda: ["", " "])  # a value's token, bare and space-led
    floor: float = -20.0  # log-probabilities are clipped here: past it, how wrong does not matter

    def __post_init__(self) -> None:
        if len(self.weight) != len(FEATURES):
            raise ConfigError(f"PRM head: expected {len(FEATURES)} weights ({', '.join(FEATURES)}), got {len(self.weight)}")

    def save(self, directory: str | Path) -> None:
        Path(directory, HEAD_FILE).write_text(json.dumps({"features": list(FEATURES), **asdict(self)}, indent=1) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> LikelihoodHead:
        path = Path(directory, HEAD_FILE)
        if not path.is_file():
            raise ConfigError(f"PRM '{directory}' has no {HEAD_FILE} (a testbed PRM is a causal LM plus that head)")
        data = json.loads(path.read_text())
        if data.pop("features", list(FEATURES)) != list(FEATURES):
            raise ConfigError(f"PRM head {path}: features must be {list(FEATURES)}")
        return cls(**data)

    def score(self, features: torch.Tensor) -> torch.Tensor:
        """Features [n, 2] -> scores [n] in [0, 1]."""
        return torch.sigmoid(features @ torch.tensor(self.weight, dtype=features.dtype) + self.bias)


class CheckedValues:
    """The checked values of a tokenizer: each value's token ids, its kind, and the map back."""

    def __init__(self, head: LikelihoodHead, tokenizer) -> None:
        self.token_ids: list[list[int]] = []  # per value: its single-token spellings
        self.kind_of: list[int] = []  # per value: index of its kind
        for k, values in enumerate(head.kinds.values()):
            for value in values:
                ids = [enc[0] for v in head.variants if len(enc := tokenizer.encode(v + value, add_special_tokens=False)) == 1]
                if not ids:
                    raise ConfigError(f"PRM head: {value!r} is not a single token of this tokenizer")
                self.token_ids.append(sorted(set(ids)))
                self.kind_of.append(k)
        self.value_of = {t: i for i, ids in enumerate(self.token_ids) for t in ids}
        if len(self.value_of) != sum(map(len, self.token_ids)):
            raise ConfigError("PRM head: a token spells two checked values")
        self.kinds = torch.tensor(self.kind_of)


class CheckedLogProbs(torch.nn.Module):
    """Hidden states [n, H] (through `lm_head`), or logits [n, V] when `lm_head` is None ->
    [n, n_values]: log-probability of each checked value at the next token, normalised within its
    kind (the LM's log-softmax, summed over a value's spellings)."""

    def __init__(self, lm_head: torch.nn.Module | None, values: CheckedValues) -> None:
        super().__init__()
        self.lm_head, self.values = lm_head, values

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden if self.lm_head is None else self.lm_head(hidden)
        logp = torch.log_softmax(logits.float(), dim=-1)
        per_value = torch.stack([logp[..., ids].logsumexp(-1) for ids in self.values.token_ids], dim=-1)
        out = torch.empty_like(per_value)
        for k in range(int(self.values.kinds.max()) + 1):
            cols = self.values.kinds == k
            out[..., cols] = per_value[..., cols] - per_value[..., cols].logsumexp(-1, keepdim=True)
        return out


def encode_prm_input(tokenizer, problem: str, steps: Sequence[str], separator: str = "\n\n") -> tuple[list[int], int, list[int]]:
    """Input ids, the first solution token, and the last token of each step's separator. Pieces are
    tokenized one by one, so a prefix of the steps gives a prefix of the ids (what the cache reuses)."""
    ids = tokenizer.encode(problem + "\n", add_special_tokens=False)
    start, ends = len(ids), []
    for step in steps:
        ids += tokenizer.encode(step + separator, add_special_tokens=False)
        ends.append(len(ids) - 1)
    return ids, start, ends


def step_features(rows: torch.Tensor, ids: Sequence[int], start: int, ends: Sequence[int], values: CheckedValues,
                  floor: float) -> torch.Tensor:
    """Features [len(ends), 2] of the steps whose last tokens are `ends`; token ids[t] is judged by
    rows[t - 1], the checked log-probabilities predicted before it (`CheckedLogProbs`)."""
    checked = torch.zeros(len(ids))  # 0 = certain: unchecked tokens never lower a minimum
    for t in range(max(1, start), len(ids)):
        v = values.value_of.get(ids[t])
        if v is not None:
            checked[t] = rows[t - 1, v].clamp(min=floor)
    feats, begin, running = [], start, 0.0
    for end in ends:
        step_min = float(checked[begin : end + 1].min()) if end >= begin else 0.0
        running = min(running, step_min)
        feats.append((running, step_min))
        begin = end + 1
    return torch.tensor(feats, dtype=torch.float32).reshape(len(ends), len(FEATURES))


def fit_head(features: torch.Tensor, labels: torch.Tensor, head: LikelihoodHead, l2: float = 1e-4) -> dict:
    """Logistic regression of step labels on the features (full batch, L-BFGS: deterministic);
    sets `head.weight` and `head.bias` and returns the final loss."""
    w = torch.zeros(features.shape[1] + 1, dtype=torch.float64, requires_grad=True)
    x = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], 1)
    y = labels.double()
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y) + l2 * (w[:-1] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w = w.detach()
    head.weight = [round(float(v), 6) for v in w[:-1]]
    head.bias = round(float(w[-1]), 6)
    with torch.no_grad():
        return {"loss": float(torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y))}


def save_prm(directory: str | Path, model, tokenizer, head: LikelihoodHead) -> None:
    """A self-contained PRM directory (over a model saved elsewhere, `head.save(directory)` is enough)."""
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    head.save(directory)


class TestbedPRM(ProcessRewardModel):
    """The head in directory `path` over the causal LM `model` (by default the one saved in `path`;
    with `path` None, the shipped head over the testbed LLM)."""

    __test__ = False  # not a pytest class

    def __init__(self, path: str | None = None, model: str | None = None, device: str = "cpu", dtype: str = "float32",
                 separator: str = "\n\n", engine: str | None = None):
        super().__init__()
        from rstitch.testbed import LLM_DIR, PRM_DIR

        if not path:
            path, model = str(PRM_DIR), model or str(LLM_DIR)
        self.head = LikelihoodHead.load(path)
        runner = load_scoring_model(engine, model or path, "PRM testbed (it reads the probabilities of the written tokens)",
                                    ("exact_distributions",), dtype=dtype, device=device)
        self.tokenizer, self.cost = runner.tokenizer, runner.cost
        self.values = CheckedValues(self.head, self.tokenizer)
        checked = CheckedLogProbs(None, self.values)
        self.scorer = PrefixCachedScorer(runner, lambda dists: checked(logit_rows(dists)))
        self.num_parameters = runner.num_parameters  # tied weights counted once
        self.name, self.separator = "testbed", separator
        self._checked: set[str] = set()
        self._testbed_only = Path(path).resolve() == PRM_DIR.resolve()  # the shipped PRM knows nothing else

    def score(self, problem: str, steps: Sequence[str]) -> list[float]:
        if not steps:
            return []
        if self._testbed_only and problem not in self._checked:
            from rstitch.scorers.oracle import parse_problem

            parse_problem(problem)
            self._checked.add(problem)
        ids, start, ends = encode_prm_input(self.tokenizer, problem, steps, self.separator)
        features = step_features(self.scorer.rows(ids), ids, start, ends, self.values, self.head.floor)
        return [float(s) for s in self.head.score(features)]
