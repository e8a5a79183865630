"""EASD's entropy threshold tau_H for a model pair (EASD eqs. 8-10): the mean of the top p of the
target's greedy entropies (nats) over calibration prompts disjoint from every evaluated benchmark
(scripts/calibrate_easd.py drives it; docs/speculative.md)."""
from __future__ import annotations

import statistics
from typing import Any

from tqdm import tqdm

from rstitch.config_groups import group_choices
from rstitch.data import load_dataset_records
from rstitch.data.prompts import PromptFormat
from rstitch.engines import ModelPair
from rstitch.errors import ConfigError
from rstitch.methods.spec_stats import greedy_entropies, mean_of_top_fraction

CALIBRATION_SETS = {"limo": "GAIR/LIMO"}  # --dataset name -> hub id (train split; field "question")


def validation_prompts(tokenizer, n: int, fmt: PromptFormat | None = None) -> list[list[int]]:
    """The testbed's validation problems (through the data registry) rendered as chat prompts."""
    fmt = fmt or PromptFormat()
    return [fmt.encode(tokenizer, record.problem) for record in load_dataset_records("testbed", split="validation", n=n)]


def check_calibration_set(dataset: str) -> str:
    """The hub id of a calibration set; an evaluated benchmark or an unknown name is a ConfigError."""
    if dataset in group_choices("dataset"):
        raise ConfigError(f"'{dataset}' is an evaluated benchmark: calibrate on data disjoint from it "
                          f"(--dataset {', '.join(CALIBRATION_SETS)}, or the testbed validation split by default)")
    if dataset not in CALIBRATION_SETS:
        raise ConfigError(f"unknown calibration set '{dataset}'; valid: {', '.join(CALIBRATION_SETS)}")
    return CALIBRATION_SETS[dataset]


def dataset_prompts(tokenizer, dataset: str, limit: int, fmt: PromptFormat, path: str | None = None) -> list[list[int]]:
    """The first ``limit`` problems of a calibration set, read by the dataset registry (the hub, or
    ``path``: a local copy such as GAIR/LIMO's limo.jsonl)."""
    check_calibration_set(dataset)
    return [fmt.encode(tokenizer, record.problem) for record in load_dataset_records(dataset, path=path, limit=limit)]


def calibrate(pair: ModelPair, prompts: list[list[int]], max_new_tokens: int, top_fraction: float) -> dict[str, Any]:
    eos = set(pair.llm.eos_token_ids) | set(pair.slm.eos_token_ids)
    entropies = [h for prompt in tqdm(prompts, desc="target greedy", unit="prompt") for h in greedy_entropies(pair.llm, prompt, max_new_tokens, eos)]
    return {
        "tau_h": mean_of_top_fraction(entropies, top_fraction),
        "slm": pair.slm.name,
        "llm": pair.llm.name,
        "top_fraction": top_fraction,
        "n_prompts": len(prompts),
        "n_positions": len(entropies),
        "max_new_tokens": max_new_tokens,
        "mean_entropy": statistics.fmean(entropies),
    }
