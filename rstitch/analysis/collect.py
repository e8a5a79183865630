"""Runs of the results store (directories with summary.json and samples.jsonl) as pandas frames: one
row per run, or one per sample. Columns, `comparison` and `group`: docs/analysis.md."""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rstitch.errors import ConfigError
from rstitch.methods import baseline_method, method_class, method_rank
from rstitch.results.keys import comparison_key, is_sharded, method_defaults, short_hash
from rstitch.results.metrics import SPEEDUP_LATENCIES
from rstitch.results.store import RUN_KEY_FILE, SAMPLES_FILE, SUMMARY_FILE, iter_samples
from rstitch.results.uncertainty import recorded_intervals

# The method every speedup is measured against (`baseline = "target"` on its class: llm_only).
BASELINE = baseline_method()

RUN_METRICS = ("n_problems", "n_samples", "accuracy", "latency_s", "latency_median_s", "latency_estimate_s", "tokens",
               "tokens_slm", "tokens_llm", "llm_token_share", "discarded_tokens", "switches", "flops",
               "latency_cpu_s",  # the decodes' mean CPU time, on a CPU (results/metrics.py), or None
               "contention")  # why the latency is not a quiet machine's (results/measurement.py), or None
SAMPLE_COLUMNS = ("id", "sample_index", "correct", "latency_s", "latency_estimate_s", "tokens", "tokens_slm",
                  "tokens_llm", "discarded_tokens", "switches", "finish_reason", "flops")
TRACE_COLUMNS = ("output_token_ids", "token_sources", "stats")

PathsLike = str | os.PathLike | Iterable[str | os.PathLike]


def _as_paths(paths: PathsLike) -> list[Path]:
    return [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]


def _dirs_holding(paths: PathsLike, name: str) -> Iterator[Path]:
    """The resolved directories holding a file `name` under each root that exists, root by root."""
    for root in _as_paths(paths):
        if root.is_dir():
            yield from (found.parent.resolve() for found in sorted(root.rglob(name)))


def find_run_dirs(paths: PathsLike) -> list[Path]:
    """Every finished run (a directory with summary.json) under `paths`, each once."""
    roots = _as_paths(paths)
    if not roots:
        raise ConfigError("no results directory given")
    for root in roots:
        if not root.is_dir():
            raise ConfigError(f"no such results directory: {root}")
    kept: dict[str, Path] = {}  # each run key once (a copy, or a run measured again): the first root's
    for run_dir in _dirs_holding(roots, SUMMARY_FILE):
        kept.setdefault(run_identity(run_dir), run_dir)
    if not kept:
        raise ConfigError(f"no finished runs ({SUMMARY_FILE}) under {', '.join(map(str, roots))}")
    return list(kept.values())


def repeated_runs(paths: PathsLike) -> list[tuple[Path, Path]]:
    """(left out, kept) for each run found first elsewhere with other samples (measured twice); copies are not listed."""
    kept: dict[str, Path] = {}
    repeated = []
    for run_dir in _dirs_holding(paths, SUMMARY_FILE):
        first = kept.setdefault(run_identity(run_dir), run_dir)
        if first != run_dir and not same_samples(first, run_dir):
            repeated.append((run_dir, first))
    return repeated


def run_identity(run_dir: Path) -> str:
    """The run key a run directory recorded (run_key.json), else its summary's place and tag."""
    key_file = run_dir / RUN_KEY_FILE
    if key_file.is_file():
        return short_hash(_read_json(key_file))
    summary = _read_json(run_dir / SUMMARY_FILE)
    return "/".join(str(summary.get(k)) for k in ("pair", "dataset", "method", "run_tag"))


def same_samples(a: Path, b: Path) -> bool:
    """Both directories hold the same decoded samples (outputs and measured latencies)."""
    if not ((a / SAMPLES_FILE).is_file() and (b / SAMPLES_FILE).is_file()):
        return False
    if (a / SAMPLES_FILE).read_bytes() == (b / SAMPLES_FILE).read_bytes():
        return True
    content = lambda d: {(s["id"], s["sample_index"]): (s.get("output_token_ids"), s.get("latency_s")) for s in read_samples(d)}  # noqa: E731
    return content(a) == content(b)


def unfinished_run_dirs(paths: PathsLike) -> list[Path]:
    """Run directories with samples but no summary (killed or still running)."""
    return sorted({d for d in _dirs_holding(paths, SAMPLES_FILE) if not (d / SUMMARY_FILE).exists()})


def older_grader_run_dirs(paths: PathsLike) -> list[Path]:
    """Finished runs whose verdicts an older grader set (`rstitch-regrade` grades them again)."""
    from rstitch.grading.version import graded_by_older_grader

    return [d for d in find_run_dirs(paths) if graded_by_older_grader(_read_json(d / SUMMARY_FILE))]


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    summary = _read_json(Path(run_dir) / SUMMARY_FILE)
    if "config" not in summary:
        raise ConfigError(f"{Path(run_dir) / SUMMARY_FILE} has no config; rerun rstitch-run to rewrite it")
    return summary


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"unreadable {path.name} in {path.parent}: {err}") from None


def setting_label(params: Mapping[str, Any], keys: Iterable[str] | None = None) -> str:
    """`k=v` for `keys` (all knobs by default); paths are shortened to their last component."""
    keys = sorted(params) if keys is None else [k for k in params if k in set(keys)]
    return " ".join(f"{k}={_short(params[k])}" for k in keys)


def _short(value: Any) -> Any:
    return Path(value).name if isinstance(value, str) and os.sep in value else value


def shown_knobs(defaults: Mapping[str, Any], params: Mapping[str, Any], varying: set[str]) -> list[str]:
    """The knobs that tell a method's runs apart in tables and plots: those that vary among its runs or differ
    from its config defaults (`results.keys.method_defaults`); else its first (main) knob, e.g. tau or delta."""
    keys = [k for k in params if k in varying or (k in defaults and defaults[k] != params[k])]
    if keys or not params:
        return keys
    first = next((k for k in defaults if k in params), None)
    return [first] if first is not None else sorted(params)[:1]


def acceptance_of(method: str, summary: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The share of the SLM's proposals kept, and what was counted: drafted steps, draft tokens, or (token-level
    hybrids, whose SLM proposes every position it holds) the SLM's share of the output tokens."""
    if summary.get("acceptance_rate") is not None:
        return float(summary["acceptance_rate"]), "steps"
    if summary.get("spec_acceptance_rate") is not None:
        return float(summary["spec_acceptance_rate"]), "draft tokens"
    if method_class(method).family == "token" and summary.get("llm_token_share") is not None:
        return 1.0 - float(summary["llm_token_share"]), "SLM token share"
    return None, None


def run_row(summary: Mapping[str, Any], config: Mapping[str, Any], run_dir: str | None = None) -> dict[str, Any]:
    """One run as a frame row, from its summary metrics and its resolved config."""
    method = config["method"]["name"]
    # The method's scalar knobs (nested options such as a PRM spec are left out, as in run tags).
    params = {k: v for k, v in config["method"].items() if k != "name" and not isinstance(v, (dict, list))}
    acceptance, kind = acceptance_of(method, summary)
    # The key the run recorded, with the fingerprints of the weights it ran (not what the paths hold today).
    key = summary.get("comparison_key") or comparison_key(config)
    row = {
        "pair": config["pair"]["name"], "dataset": config["dataset"]["name"], "method": method,
        "setting_full": setting_label(params), "method_id": short_hash(config["method"]),
        "budget": config.get("max_new_tokens"),
        "comparison": short_hash(key), "comparison_key": key, "run_dir": run_dir,
        **{k: summary.get(k) for k in RUN_METRICS},
        **{f"{speedup}_recorded": summary.get(speedup) for speedup in SPEEDUP_LATENCIES.values()},
        **recorded_intervals(summary),  # replaced by those of the samples in reports (`uncertainty.with_intervals`)
        "acceptance": acceptance, "acceptance_kind": kind, "params": params,
    }
    row.update({f"method.{k}": v for k, v in params.items()})
    return row


def runs_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows to the runs frame: speedups against the LLM-only run of each comparison, group labels, order."""
    frame = pd.DataFrame(rows)
    frame["setting"] = _settings(frame)
    for latency, speedup in SPEEDUP_LATENCIES.items():  # Lat(BASELINE) / Lat(run) within each comparison, else as recorded
        times = pd.to_numeric(frame[latency], errors="coerce")
        measured = frame["comparison"].map(times[frame["method"] == BASELINE].groupby(frame["comparison"]).min()) / times
        frame[speedup] = measured.where(measured.notna(), pd.to_numeric(frame[f"{speedup}_recorded"], errors="coerce")).astype(float)
    # `pair / dataset / budget N`, plus the settings that tell its comparison apart (`comparison_settings`)
    frame["group"] = _with_settings(frame["pair"] + " / " + frame["dataset"] + " / budget " + frame["budget"].astype(str), frame, ", ")
    frame = frame.assign(_order=frame["method"].map(method_rank)).sort_values(["pair", "dataset", "budget", "comparison", "_order", "latency_s"])
    return frame.drop(columns="_order").reset_index(drop=True)


def load_runs(paths: PathsLike) -> pd.DataFrame:
    """One row per finished run under `paths` but shard runs (`rstitch-merge`); recorded speedups where LLM-only is absent."""
    summaries = {run_dir: read_summary(run_dir) for run_dir in find_run_dirs(paths)}
    rows = [run_row(s, s["config"], str(d)) for d, s in summaries.items() if not is_sharded(s["config"]["dataset"])]
    if not rows:
        raise ConfigError("only shard runs found; combine them with rstitch-merge first")
    return runs_frame(rows)


def _settings(frame: pd.DataFrame) -> pd.Series:
    settings = pd.Series("", index=frame.index, dtype=object)
    for method, runs in frame.groupby("method"):
        keys = set().union(*(p.keys() for p in runs["params"]))
        varying = {k for k in keys if len({repr(p.get(k)) for p in runs["params"]}) > 1}
        defaults = method_defaults(str(method))
        for index, params in runs["params"].items():
            settings[index] = setting_label(params, shown_knobs(defaults, params, varying))
    # Configurations that differ only in nested options (e.g. the PRM) keep apart by their hash.
    clash = frame.assign(s=settings).groupby(["method", "s"])["method_id"].transform("nunique") > 1
    return settings.where(~clash, settings + " [" + frame["method_id"] + "]")


def is_baseline(method: str) -> bool:
    """A single-model reference run (LLM-only, SLM-only), not a hybrid."""
    return method_class(method).baseline is not None


LABEL_BASE = ["pair", "dataset", "budget"]  # what every group label names
MAX_LABEL_VALUE_CHARS = 24  # longer values (prompt texts) are shown by their hash
_UNSET = "default"  # a key a comparison does not record (e.g. batch_size 1, on_overflow error)


def dataset_labels(runs: pd.DataFrame) -> pd.Series:
    """Dataset names as table columns, with the settings that tell their comparisons apart."""
    return _with_settings(runs["dataset"], runs, " ")


def _with_settings(labels: pd.Series, frame: pd.DataFrame, separator: str) -> pd.Series:
    settings = comparison_settings(frame)
    return labels.where(settings == "", labels + separator + settings)


def comparison_settings(frame: pd.DataFrame) -> pd.Series:
    """Per run, `path=value` for each comparison-key setting that differs among its pair, dataset and budget's comparisons."""
    out = pd.Series("", index=frame.index, dtype=object)
    for _, block in frame.groupby(LABEL_BASE, sort=False, dropna=False):
        # each comparison's key as {dotted path: leaf value} (an empty mapping has no leaf)
        keys = {c: pd.json_normalize(dict(k), sep=".").to_dict("records")[0] for c, k in zip(block["comparison"], block["comparison_key"])}
        if len(keys) < 2:
            continue
        paths = sorted(set().union(*keys.values()))
        differing = [p for p in paths if len({repr(k.get(p, _UNSET)) for k in keys.values()}) > 1]
        labels = {c: " ".join(f"{p}={_label_value(k.get(p, _UNSET))}" for p in differing) for c, k in keys.items()}
        out[block.index] = block["comparison"].map(labels)
    return out


def _label_value(value: Any) -> str:
    text = str(_short(value))
    return text if len(text) <= MAX_LABEL_VALUE_CHARS and text.isprintable() else f"#{short_hash(value)}"


def load_samples(runs: pd.DataFrame, traces: bool = False) -> pd.DataFrame:
    """One row per (run, problem, sample) of `runs`; `traces` adds token ids, token sources and `stats`."""
    run_columns = ["run_dir", "pair", "dataset", "method", "setting", "budget", "comparison", "group"]
    wanted = list(SAMPLE_COLUMNS) + (list(TRACE_COLUMNS) if traces else [])
    rows = [{**run, **{k: record.get(k) for k in wanted}}
            for run in runs[run_columns].to_dict("records") for record in read_samples(Path(run["run_dir"]))]
    return pd.DataFrame(rows, columns=run_columns + wanted)


def read_samples(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(run_dir) / SAMPLES_FILE
    if not path.exists():
        raise ConfigError(f"{run_dir} has a summary but no {SAMPLES_FILE}")
    return list(iter_samples(path))


def paired_with_baseline(samples: pd.DataFrame) -> pd.DataFrame:
    """Each sample of a non-baseline run beside the baseline's of the same problem and comparison, with
    `speedup`, `token_reduction` (1 - tokens / baseline tokens) and `outcome` (who was correct)."""
    base = samples[samples["method"] == BASELINE]
    keys = ["comparison", "id", "sample_index"]
    base = base[keys + ["latency_s", "tokens", "correct"]].rename(
        columns={"latency_s": "baseline_latency_s", "tokens": "baseline_tokens", "correct": "baseline_correct"})
    duplicated = base.duplicated(keys, keep=False)
    if duplicated.any():
        dirs = sorted(set(map(str, samples.loc[base.index[duplicated], "run_dir"]))) if "run_dir" in samples else []
        raise ConfigError(f"several '{BASELINE}' runs share one comparison{': ' + ', '.join(dirs) if dirs else ''}; pass one of them")
    paired = samples[samples["method"] != BASELINE].merge(base, on=keys, how="inner")
    paired["speedup"] = paired["baseline_latency_s"] / paired["latency_s"]
    paired["token_reduction"] = 1.0 - paired["tokens"] / paired["baseline_tokens"]
    paired["outcome"] = [OUTCOMES[bool(c), bool(b)] for c, b in zip(paired["correct"], paired["baseline_correct"])]
    return paired


# Who was correct, by (this method, the baseline).
OUTCOMES = {(True, True): "both correct", (True, False): "only this method correct",
            (False, True): f"only {BASELINE} correct", (False, False): "both wrong"}


def runs_from_wandb(wandb_runs: Iterable[Any]) -> pd.DataFrame:
    """The runs frame from `wandb.Api().runs(...)` (WandbLogger stores the resolved config and metrics);
    runs without a method config (sweep summaries) and shard runs are left out; run_dir holds the URL."""
    rows = []
    for run in wandb_runs:
        config, summary = dict(run.config), dict(run.summary)
        if not isinstance(config.get("method"), Mapping) or "pair" not in config or is_sharded(config["dataset"]):
            continue
        rows.append(run_row(summary, config, getattr(run, "url", None)))
    if not rows:
        raise ConfigError("no rstitch runs (with a method config) among the W&B runs")
    return runs_frame(rows)


def load_wandb_runs(project: str, entity: str | None = None, filters: dict | None = None) -> pd.DataFrame:
    """The runs frame of a W&B project (needs network access and an API key)."""
    import wandb

    path = f"{entity}/{project}" if entity else project
    return runs_from_wandb(wandb.Api().runs(path, filters=filters))
