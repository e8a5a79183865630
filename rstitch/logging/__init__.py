"""Experiment loggers (config group `logger/`): W&B, or none."""
from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    import wandb

WandbMode = Literal["online", "offline", "disabled", "shared"]

PARETO_KEYS = ("accuracy", "accuracy_se", "latency_s", "tokens", "speedup", "token_ratio", "per_token_latency_ratio",
               "accuracy_diff", "accuracy_diff_se", "llm_token_share")


def wandb_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The run's numbers as W&B summary scalars: the Pareto point first, then every number, and
    each interval (`accuracy_ci`, `speedup_ci`, ... as [low, high]) as `<name>_low` and `<name>_high`."""
    point = {k: summary[k] for k in PARETO_KEYS if summary.get(k) is not None}
    numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float))}
    intervals = {f"{k}_{end}": bound for k, v in summary.items() if k.endswith("_ci") and isinstance(v, (list, tuple))
                 and len(v) == 2 for end, bound in zip(("low", "high"), v)}
    return {**point, **numbers, **intervals}


class NullLogger:
    def start(self, name: str, config: dict[str, Any], run_id: str) -> None:
        pass

    def log_sample(self, record: dict[str, Any]) -> None:
        pass

    def finish(self, summary: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        pass


class WandbLogger(NullLogger):
    """One W&B run per configuration: its summary holds the Pareto point; a table holds samples.

    The run id derives from the run key, so a resumed run continues the same W&B run. Without an
    API key (and no explicit mode) it logs offline. `quiet` (W&B's setting) leaves out W&B's run
    history and summary on the console, which would otherwise bury the result table.
    """

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

    def start(self, name: str, config: dict[str, Any], run_id: str) -> None:
        import wandb

        self.run = wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, group=self.group, tags=self.tags,
            name=name, config=config, id=hashlib.sha1(run_id.encode()).hexdigest()[:16], resume="allow",
            dir=self.dir, reinit="finish_previous", settings=self.settings(),
        )

    def settings(self) -> Any:
        """W&B's settings of every run this logger starts (the sweep summary's too)."""
        import wandb

        return wandb.Settings(quiet=self.quiet)

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
        table = wandb.Table(columns=list(self.TABLE_COLUMNS))
        for s in samples:
            table.add_data(*[s.get(c) for c in self.TABLE_COLUMNS])
        run.log({"samples": table})
        run.finish()
