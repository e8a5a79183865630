"""The W&B summary of a sweep: after a Hydra multirun, one W&B run holds every point of the sweep
(a table with each point's intervals, the Pareto frontier flagged per comparison group, with the
share of bootstrap resamples of the problems in which each point stays on it), a native scatter
plot of accuracy vs latency, and the accuracy-latency figures with error bars.

`SweepSummary` is a Hydra callback (conf/config.yaml, `hydra.callbacks`). After every multirun it
prints one table of the sweep's runs, last on the console (with the submitit launchers the jobs'
own output goes to `.submitit/`, so this is the only result shown); with `logger=wandb` it logs
the W&B summary first. The jobs' run directories come from `on_job_end`, or, when a launcher runs
the jobs in other processes (submitit), from the runs under the sweep directory whose summary was
written after the multirun started.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rstitch.errors import ConfigError
from rstitch.results.store import SUMMARY_FILE

POINT_COLUMNS = ("group", "method", "setting", "accuracy", "accuracy_se", "accuracy_ci_low", "accuracy_ci_high",
                 "accuracy_diff", "accuracy_diff_se", "accuracy_diff_p", "latency_s", "latency_ci_low", "latency_ci_high",
                 "latency_estimate_s", "speedup", "speedup_ci_low", "speedup_ci_high", "token_ratio", "token_ratio_ci_low",
                 "token_ratio_ci_high", "per_token_latency_ratio", "per_token_latency_ratio_ci_low",
                 "per_token_latency_ratio_ci_high", "tokens", "tokens_slm", "tokens_llm", "llm_token_share", "acceptance",
                 "acceptance_kind", "flops", "on_frontier", "frontier_share", "run_dir")


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.run_dirs: list[Path] = []
        self.started = time.time()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.run_dirs, self.started = [], time.time()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        run_dir = Path(config.hydra.runtime.output_dir)
        if (run_dir / SUMMARY_FILE).exists():
            self.run_dirs.append(run_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import instantiate

        from rstitch.logging import WandbLogger

        sweep_dir = Path(config.hydra.sweep.dir)
        # The jobs' runs, and the runs they finished besides (baseline=auto's llm_only), whichever launcher ran them.
        run_dirs = sorted({d.resolve() for d in [*finished_since(sweep_dir, self.started), *self.run_dirs]})
        logger = instantiate(config.logger)
        if isinstance(logger, WandbLogger):
            try:
                log_sweep_summary(run_dirs, logger, name=f"sweep/{sweep_dir.name}")
            except ConfigError as err:  # the jobs' results stand; only the summary is missing
                print(f"rstitch-run: warning: no W&B sweep summary: {err}", file=sys.stderr)
        print(sweep_table(run_dirs, sweep_dir), flush=True)


def sweep_table(run_dirs: list[Path], sweep_dir: Path) -> str:
    """The result table of a multirun's runs, and what to do about missing speedups."""
    from rstitch.results.measurement import contention_notes
    from rstitch.results.metrics import baseline_method
    from rstitch.results.summary import format_table

    summaries = [json.loads((d / SUMMARY_FILE).read_text()) for d in run_dirs]
    if not summaries:
        return f"sweep: no run finished under {sweep_dir}"
    lines = [format_table(*summaries), *contention_notes(summaries), f"sweep: {len(summaries)} runs under {sweep_dir}"]
    if any(s.get("speedup") is None and s.get("method") != baseline_method() for s in summaries):
        lines.append(f"speedup -: no {baseline_method()} run with the same comparison key (each run's output says why); "
                     "rerun with baseline=auto, which runs it first")
    return "\n".join(lines)


def finished_since(root: Path, start: float) -> list[Path]:
    return sorted(p.parent for p in root.rglob(SUMMARY_FILE) if p.stat().st_mtime >= start)


def log_sweep_summary(run_dirs: list[Path], logger: Any, name: str) -> str:
    """Log the runs in `run_dirs` as one W&B run of `logger`'s project; returns the run's id."""
    import wandb

    from rstitch.analysis import load_runs, load_samples, mark_frontier
    from rstitch.analysis.plots import accuracy_latency_figure
    from rstitch.analysis.report import ReportFigure, slug, wandb_image
    from rstitch.analysis.uncertainty import with_intervals

    if not run_dirs:
        raise ConfigError("the multirun finished no run")
    runs = mark_frontier(load_runs(run_dirs))
    runs = with_intervals(runs, load_samples(runs))  # error bars and frontier shares, as in rstitch-report
    points = runs[list(POINT_COLUMNS)].astype({"on_frontier": bool})
    table = wandb.Table(dataframe=points)
    run_id = hashlib.sha1("\n".join(sorted(map(str, runs["run_dir"]))).encode()).hexdigest()[:16]
    run = wandb.init(project=logger.project, entity=logger.entity, mode=logger.mode, group=logger.group,
                     tags=logger.tags, dir=logger.dir, name=name, id=run_id, job_type="sweep-summary",
                     resume="allow", reinit="finish_previous", config={"run_dirs": list(points["run_dir"])},
                     settings=logger.settings())
    payload: dict[str, Any] = {
        "sweep/points": table,
        "sweep/accuracy_vs_latency": wandb.plot.scatter(table, "latency_s", "accuracy", title="accuracy vs latency (s)"),
    }
    for group in runs["group"].unique():
        figure = ReportFigure(slug(group), f"accuracy vs latency: {group}", accuracy_latency_figure(runs, group))
        payload[f"sweep/frontier/{figure.name}"] = wandb_image(figure)
    run.log(payload)
    run.summary.update({"sweep/runs": len(runs), "sweep/frontier_runs": int(runs["on_frontier"].sum())})
    run.finish()
    return run_id
