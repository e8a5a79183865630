"""Experiment loggers (config group `logger/`): W&B, or none."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    import wandb

WandbMode = Literal["online", "offline", "disabled", "shared"]

# The speedups lead with the latency model's estimate, then CPU time, then wall clock: on a shared CPU
# other jobs move them in the reverse order (docs/analysis.md, "Timings on a shared machine").
PARETO_KEYS = ("accuracy", "accuracy_se", "latency_s", "tokens", "speedup_estimate", "speedup_cpu", "speedup", "token_ratio",
               "per_token_latency_ratio", "accuracy_diff", "accuracy_diff_se", "llm_token_share")


def wandb_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The run's numbers as W&B scalars: the Pareto point first, each `[low, high]` interval as `<name>_low`, `_high`."""
    point = {k: summary[k] for k in PARETO_KEYS if summary.get(k) is not None}
    numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float))}
    intervals = {f"{k}_{end}": bound for k, v in summary.items() if k.endswith("_ci") and isinstance(v, (list, tuple))
                 and len(v) == 2 for end, bound in zip(("low", "high"), v)}
    return {**point, **numbers, **intervals}


LOGGED_FILE = "wandb_run.json"  # in a run directory: the W&B run that holds it, once finished


class NullLogger:
    def start(self, name: str, config: dict[str, Any], run_id: str, run_dir: str | os.PathLike | None = None) -> None:
        pass

    def logged(self, run_dir: str | os.PathLike) -> bool:
        """Whether this logger already holds the finished run of `run_dir`."""
        return False

    def log_sample(self, record: dict[str, Any]) -> None:
        pass

    def finish(self, summary: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        pass


class WandbLogger(NullLogger):
    """One W&B run per run directory (its id from the absolute path, so a resume continues it; not
    logged again once `wandb_run.json` names it): the Pareto point in its summary, a table of
    samples. Offline without an API key; `quiet` keeps W&B's output from burying the result table."""

    TABLE_COLUMNS = ("id", "sample_index", "correct", "latency_s", "tokens", "tokens_slm", "tokens_llm", "switches", "answer", "gold")

    def __init__(self, project: str = "rstitch", entity: str | None = None, mode: str = "auto",
                 group: str | None = None, tags: list[str] | None = None, dir: str | None = None,
                 quiet: bool = True):
        self.project, self.entity, self.group, self.tags, self.dir = project, entity, group, tags, dir
        self.quiet = quiet
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.mode = cast(WandbMode, mode)  # from the config: wandb.init rejects any other value itself
        self.run: wandb.Run | None = None
        self.run_dir: Path | None = None

    def destination(self) -> dict[str, Any]:
        return {"project": self.project, "entity": self.entity, "mode": self.mode}

    def logged(self, run_dir: str | os.PathLike) -> bool:
        try:
            record = json.loads((Path(run_dir) / LOGGED_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return all(record.get(k) == v for k, v in self.destination().items())

    def start(self, name: str, config: dict[str, Any], run_id: str, run_dir: str | os.PathLike | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        identity = str(self.run_dir.resolve()) if self.run_dir is not None else run_id
        self.run = self.init(name=name, config=config, id=hashlib.sha1(identity.encode()).hexdigest()[:16])
        saved = None if self.run_dir is None else self.run_dir / "samples.jsonl"
        decoded = saved.read_bytes().count(b"\n") if saved is not None and saved.is_file() else 0  # a resumed run's
        if decoded:
            print(f"rstitch-run: resuming W&B run {self.run.id}: {decoded} samples of {self.run_dir} were decoded "
                  "before", file=sys.stderr)

    def init(self, **run: Any) -> wandb.Run:
        """A W&B run (resumed where its id exists) in this logger's project, mode, group, tags and directory."""
        import wandb

        return wandb.init(project=self.project, entity=self.entity, mode=self.mode, group=self.group, tags=self.tags,
                          dir=self.dir, resume="allow", reinit="finish_previous",
                          settings=wandb.Settings(quiet=self.quiet, silent=self.quiet), **run)

    def _started(self) -> wandb.Run:
        assert self.run is not None, "start() opens the W&B run before samples or the summary are logged"
        return self.run

    def log_sample(self, record: dict[str, Any]) -> None:
        self._started().log({"sample/correct": float(record["correct"]), "sample/latency_s": record["latency_s"],
                      "sample/tokens": record["tokens"]})

    def finish(self, summary: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        import wandb

        run = self._started()
        run.summary.update(wandb_summary(summary))
        run.log({"samples": wandb.Table(columns=list(self.TABLE_COLUMNS), data=[[s.get(c) for c in self.TABLE_COLUMNS] for s in samples])})
        run.finish()
        if self.quiet:  # W&B's own lines are silenced: say once where the run went
            where = f"offline in {run.dir}" if self.mode == "offline" else f"to {self.mode} project {self.project}"
            print(f"rstitch-run: W&B run {run.id} logged {where}", file=sys.stderr)
        if self.run_dir is not None:
            (self.run_dir / LOGGED_FILE).write_text(json.dumps({"id": run.id, **self.destination()}) + "\n")
