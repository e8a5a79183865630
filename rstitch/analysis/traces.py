"""Token-level quantities of stored traces: samples keep token ids, not entropies, so a model of the run's
pair scores the rebuilt prompt + output again, giving at each position its entropy and whether its greedy
token is the stored one (token consistency, R-Stitch figure 1a, when the SLM scores the LLM's trace)."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from rstitch.analysis.collect import BASELINE, read_samples, read_summary
from rstitch.errors import ConfigError
from rstitch.results.store import SAMPLES_FILE

SCORERS = ("slm", "llm")
CHUNK = 256  # tokens per scoring forward: bounds the logits kept at once (CHUNK x vocabulary)
TOKEN_COLUMNS = ("run_dir", "method", "setting", "group", "comparison", "id", "sample_index", "correct", "position",
                 "token", "source", "entropy", "normalized_entropy", "scorer_agrees")


def warn_if_models_changed(pair_cfg: dict[str, Any], run_dir: Path) -> None:
    """Warn when a local model directory was written after the run's samples (retrained in place): its
    scores would not be those of the weights that decoded the run."""
    recorded = (run_dir / SAMPLES_FILE).stat().st_mtime
    for key in ("slm", "llm"):
        path = Path(str(pair_cfg[key].get("path", "")))
        if path.is_dir() and max((f.stat().st_mtime for f in path.iterdir() if f.is_file()), default=0) > recorded:
            warnings.warn(f"{path} changed after {run_dir} was recorded: its scores are of the new weights",
                          stacklevel=2)


def token_scores(runs: pd.DataFrame, scorer: str = "slm", max_samples: int | None = None) -> pd.DataFrame:
    """One row per output token of each run's first `max_samples` samples, scored by the run's `scorer` model:
    entropy (nats), normalized_entropy (H / log V, R-Stitch's tau scale), scorer_agrees, source."""
    if scorer not in SCORERS:
        raise ConfigError(f"unknown scorer '{scorer}'; valid: {', '.join(SCORERS)}")
    from rstitch.data import load_dataset_records
    from rstitch.data.prompts import PromptFormat
    from rstitch.engines.cache import get_pair

    rows = []
    for _, run in runs.iterrows():
        config = read_summary(run["run_dir"])["config"]
        warn_if_models_changed(config["pair"], Path(run["run_dir"]))
        pair = get_pair(config["pair"], config["engine"])  # loaded once per configuration
        prompt = PromptFormat(**config["prompt"])
        prompts = {r.id: prompt.encode(pair.tokenizer, r.problem) for r in load_dataset_records(**config["dataset"])}
        for sample in read_samples(Path(run["run_dir"]))[:max_samples]:
            if sample["id"] not in prompts:
                raise ConfigError(f"{run['run_dir']}: problem {sample['id']} is not in the run's dataset any more")
            tokens, sources = sample["output_token_ids"], sample["token_sources"]
            sequence = getattr(pair, scorer).new_sequence(prompts[sample["id"]])
            # lazily, CHUNK tokens a forward; the last distribution of each predicts the token after the chunk
            dists = (d for start in range(0, len(tokens), CHUNK) for d in sequence.score(tokens[start:start + CHUNK])[:-1])
            for position, (dist, token, source) in enumerate(zip(dists, tokens, sources)):
                rows.append({"run_dir": run["run_dir"], "method": run["method"], "setting": run["setting"],
                             "group": run["group"], "comparison": run["comparison"], "id": sample["id"],
                             "sample_index": sample["sample_index"], "correct": bool(sample["correct"]),
                             "position": position, "token": token, "source": "SLM" if source == 0 else "LLM",
                             "entropy": dist.entropy, "normalized_entropy": dist.normalized_entropy,
                             "scorer_agrees": dist.argmax == token})
    return pd.DataFrame(rows, columns=list(TOKEN_COLUMNS))


def trace_entropy(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per trace (run, problem, sample): mean and max normalized entropy, token count, correctness."""
    keys = ["run_dir", "method", "setting", "group", "id", "sample_index", "correct"]
    return (tokens.groupby(keys, sort=False)["normalized_entropy"]
            .agg(mean_entropy="mean", max_entropy="max", tokens="size").reset_index())


def token_consistency(runs: pd.DataFrame, max_samples: int | None = None) -> pd.DataFrame:
    """Per sample of each LLM-only run (greedy: its trace is the LLM's greedy one), the share of positions
    at which the SLM's greedy token equals the LLM's: R-Stitch's token consistency."""
    baseline = runs[runs["method"] == BASELINE]
    if baseline.empty:
        raise ConfigError(f"token consistency needs an {BASELINE} run")
    tokens = token_scores(baseline, "slm", max_samples)
    return (tokens.groupby(["comparison", "group", "id", "sample_index"], sort=False)["scorer_agrees"]
            .agg(consistency="mean", positions="size").reset_index())


def speedup_vs_consistency(runs: pd.DataFrame, paired: pd.DataFrame, consistency: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per problem, and per run (consistency pooled over positions), of the speculative methods: the speedup
    over LLM-only against the token consistency of the problem's LLM trace."""
    methods = sorted(set(runs.loc[runs["acceptance_kind"] == "draft tokens", "method"]))
    keys = ["comparison", "id", "sample_index"]
    points = paired[paired["method"].isin(methods)].merge(consistency.drop(columns="group"), on=keys)
    points = points[["run_dir", "method", "setting", "group", *keys, "consistency", "positions", "speedup"]]
    weighted = points.assign(agree=points["consistency"] * points["positions"])
    pooled = weighted.groupby("run_dir")[["agree", "positions"]].sum()
    run_points = runs[runs["run_dir"].isin(pooled.index)][["run_dir", "method", "setting", "group", "speedup"]].copy()
    run_points["consistency"] = run_points["run_dir"].map(pooled["agree"] / pooled["positions"])
    return points.reset_index(drop=True), run_points.reset_index(drop=True)
