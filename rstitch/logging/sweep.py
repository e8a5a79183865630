"""The console table and W&B summary of a sweep (a Hydra callback: docs/scale-out.md), over its points'
run directories composed again from its overrides: another sweep's runs in the same `results_root` stay out."""
from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from rstitch.configs import override_key
from rstitch.errors import ConfigError
from rstitch.results.store import SUMMARY_FILE, atomic_write, iter_samples

POINT_COLUMNS = ("group", "method", "setting", "accuracy", "accuracy_se", "accuracy_ci_low", "accuracy_ci_high", "accuracy_diff",
                 "accuracy_diff_se", "accuracy_diff_p", "latency_s", "latency_ci_low", "latency_ci_high", "latency_estimate_s",
                 *(f"{name}{end}" for name in ("speedup", "speedup_cpu", "speedup_estimate", "token_ratio", "per_token_latency_ratio")
                   for end in ("", "_ci_low", "_ci_high")),
                 "tokens", "tokens_slm", "tokens_llm", "llm_token_share", "acceptance", "acceptance_kind", "flops", "on_frontier",
                 "frontier_share", "run_dir")


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.run_dirs: list[Path] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.run_dirs = []

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self.run_dirs.append(Path(config.hydra.runtime.output_dir))  # kept where it wrote a summary

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra import compose
        from hydra.utils import instantiate
        from omegaconf import OmegaConf

        from rstitch.config_groups import resolved_run_config
        from rstitch.logging import WandbLogger

        sweep_dir = Path(config.hydra.sweep.dir)
        params = OmegaConf.to_container(config.hydra.sweeper.params) if config.hydra.sweeper.get("params") else None
        # The jobs' runs, and the baselines they ran (baseline=auto's llm_only), whichever launcher ran them.
        try:
            points = sweep_points(list(config.hydra.overrides.task), params if isinstance(params, dict) else None)
            own = [d for point in points for d in point_run_dirs(resolved_run_config(compose(config_name="config", overrides=point)))]
        except (ConfigError, HydraException, OmegaConfBaseException) as err:  # the table then holds the runs this process ran
            print(f"rstitch-run: warning: the sweep's run directories could not be composed again: {err}", file=sys.stderr)
            own = []
        run_dirs = sorted({d.resolve() for d in [*own, *self.run_dirs] if (d / SUMMARY_FILE).is_file()})
        fill_speedups(run_dirs)
        logger = instantiate(config.logger)
        if isinstance(logger, WandbLogger):
            try:
                log_sweep_summary(run_dirs, logger, name=f"sweep/{sweep_dir.name}", state_dir=sweep_dir / ".sweep_summaries")
            except ConfigError as err:  # the jobs' results stand; only the summary is missing
                print(f"rstitch-run: warning: no W&B sweep summary: {err}", file=sys.stderr)
        print(sweep_table(run_dirs, sweep_dir), flush=True)


def sweep_points(overrides: Sequence[str], params: Mapping[Any, Any] | None = None) -> list[list[str]]:
    """The points of `rstitch-run -m <overrides>` (and a preset's `hydra.sweeper.params`), by Hydra's own sweeper."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = {override_key(o) for o in overrides}
    arguments = [f"{k}={v}" for k, v in (params or {}).items() if k not in given] + list(overrides)
    parsed = OverridesParser.create().parse_overrides(arguments)
    return [list(point) for batch in BasicSweeper.split_arguments(parsed, None) for point in batch]


def point_run_dirs(cfg: Mapping[str, Any]) -> list[Path]:
    """The run directories a point's job writes: its own, and its baseline's with `baseline=auto`."""
    from rstitch.results.baseline import baseline_config, wants_baseline_run
    from rstitch.results.keys import run_dir

    dirs = [run_dir(cfg["results_root"], cfg)]
    if wants_baseline_run(dict(cfg)):
        dirs.append(run_dir(cfg["results_root"], baseline_config(dict(cfg))))  # the same pair and dataset: the same comparison
    return dirs


def fill_speedups(run_dirs: Sequence[Path]) -> list[Path]:
    """Rewrite the summary of each point that finished before its baseline (parallel jobs); returns them."""
    from rstitch.results.metrics import baseline_method, compare_with_baseline

    filled = []
    for run_dir in run_dirs:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
        if summary.get("speedup") is not None or summary.get("method") == baseline_method() or summary.get("partial"):
            continue
        samples = list(iter_samples(run_dir / "samples.jsonl"))
        comparison = compare_with_baseline(summary, samples, run_dir.parent.parent)
        if comparison.get("speedup") is None:
            continue
        atomic_write(run_dir / SUMMARY_FILE, json.dumps({**summary, **comparison}, indent=2))
        filled.append(run_dir)
    return filled


def sweep_table(run_dirs: list[Path], sweep_dir: Path) -> str:
    """The result table of a multirun's runs, and what to do about missing speedups."""
    from rstitch.results.measurement import contention_notes
    from rstitch.results.metrics import baseline_method
    from rstitch.results.summary import format_table, speedup_legend

    summaries = [json.loads((d / SUMMARY_FILE).read_text()) for d in run_dirs]
    if not summaries:
        return f"sweep: no run finished under {sweep_dir}"
    lines = [format_table(*summaries), *speedup_legend(*summaries), *contention_notes(summaries),
             f"sweep: {len(summaries)} runs under {sweep_dir}"]
    if any(s.get("speedup") is None and s.get("method") != baseline_method() for s in summaries):
        lines.append(f"speedup -: no {baseline_method()} run with the same comparison key (each run's output says why); "
                     "rerun with baseline=auto, which runs it first")
    return "\n".join(lines)


def samples_fingerprint(run_dirs: Sequence[Path]) -> str:
    """A hash of what a sweep summary shows (runs, samples, speedups), not the summaries' timing fields."""
    digest = hashlib.sha1()
    for run_dir in sorted(run_dirs):
        digest.update(str(run_dir).encode())
        samples = run_dir / "samples.jsonl"
        digest.update(samples.read_bytes() if samples.is_file() else b"")
        summary = json.loads((run_dir / SUMMARY_FILE).read_text()) if (run_dir / SUMMARY_FILE).is_file() else {}
        digest.update(repr(summary.get("speedup")).encode())
    return digest.hexdigest()


def log_sweep_summary(run_dirs: list[Path], logger: Any, name: str, state_dir: Path | None = None) -> str | None:
    """Log `run_dirs` as one W&B run of `logger`'s project; its id, or None when `state_dir` has it up to date."""
    import wandb

    from rstitch.analysis import load_runs, load_samples, mark_frontier
    from rstitch.analysis.plots import accuracy_latency_figure
    from rstitch.analysis.report import ReportFigure, slug, wandb_image
    from rstitch.logging.wandb_charts import accuracy_latency_error_bars
    from rstitch.results.uncertainty import with_intervals

    if not run_dirs:
        raise ConfigError("the multirun finished no run")
    runs = mark_frontier(load_runs(run_dirs))
    runs = with_intervals(runs, load_samples(runs))  # error bars and frontier shares, as in rstitch-report
    points = runs[list(POINT_COLUMNS)].astype({"on_frontier": bool})
    table = wandb.Table(dataframe=points)
    run_id = hashlib.sha1("\n".join(sorted(map(str, runs["run_dir"]))).encode()).hexdigest()[:16]
    fingerprint = samples_fingerprint(run_dirs)
    state = state_dir / f"{run_id}.sha1" if state_dir is not None else None
    if state is not None and state.is_file() and state.read_text() == fingerprint:
        print(f"sweep: W&B sweep summary {run_id} is up to date (no sample changed)", file=sys.stderr)
        return None
    run = logger.init(name=name, id=run_id, job_type="sweep-summary", config={"run_dirs": list(points["run_dir"])})
    payload: dict[str, Any] = {
        "sweep/points": table,
        "sweep/accuracy_vs_latency": wandb.plot.scatter(table, "latency_s", "accuracy", title="accuracy vs latency (s)"),
        "sweep/accuracy_vs_latency_error_bars": accuracy_latency_error_bars(points),
    }
    for group in runs["group"].unique():
        figure = ReportFigure(slug(group), f"accuracy vs latency: {group}", accuracy_latency_figure(runs, group))
        payload[f"sweep/frontier/{figure.name}"] = wandb_image(figure)
    run.log(payload)
    run.summary.update({"sweep/runs": len(runs), "sweep/frontier_runs": int(runs["on_frontier"].sum())})
    run.finish()
    if state is not None:
        state.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(state, fingerprint)
    return run_id
