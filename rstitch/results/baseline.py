"""The baseline of a run's speedup: why a speedup is missing, the command that makes the baseline,
and the configuration `baseline=auto` runs (or resumes) before the method."""
from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rstitch.configs import override_key
from rstitch.errors import ConfigError
from rstitch.results.keys import RunIdentity, comparison_dir, identify, key_differences
from rstitch.results.metrics import baseline_method
from rstitch.results.store import find_summaries

BASELINE_CHOICES = (None, "auto")  # the top-level `baseline` knob; it is not part of any run key


def wants_baseline_run(cfg: dict[str, Any]) -> bool:
    """True when `baseline=auto` asks for the baseline run before this one (not for the baseline itself)."""
    choice = cfg.get("baseline")
    if choice not in BASELINE_CHOICES:
        raise ConfigError(f"baseline must be null or auto, got {choice!r}")
    return choice == "auto" and cfg["method"]["name"] != baseline_method()


def baseline_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` with the baseline method, as `rstitch-run method=<baseline>` with the same other
    settings composes it: same comparison key, so the same run directory and the same problems."""
    from omegaconf import OmegaConf

    from rstitch.configs import CONF_DIR

    method = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "method" / f"{baseline_method()}.yaml"), resolve=True)
    return {**cfg, "method": method}


def planned_runs(cfg: dict[str, Any], results_root: str | Path, run_dir: str | Path | None = None) -> list[RunIdentity]:
    """The runs a composed config (without `results_root` and `logger`) makes, in order: with
    `baseline=auto`, its baseline run first (run, or resumed: a finished one decodes nothing), so that
    its speedup is filled; then its own, in `run_dir` (default: its standard directory)."""
    root = comparison_dir(results_root, cfg)
    baseline = [identify(baseline_config(cfg), root)] if wants_baseline_run(cfg) else []
    return [*baseline, identify(cfg, root, run_dir)]


def is_method_override(override: str) -> bool:
    """`method=...`, `method.tau=...` (also with + or ~) and `baseline=...`: the settings a
    baseline run does not share with the run."""
    key = override_key(override)
    return key in ("method", "baseline") or key.startswith("method.")


def baseline_command(overrides: Sequence[str]) -> str:
    """The `rstitch-run` line that makes the baseline of a run given by its command-line overrides."""
    kept = [shlex.quote(o) for o in overrides if not is_method_override(o)]
    return " ".join(["rstitch-run", f"method={baseline_method()}", *kept])


def nearest_differences(summary: dict[str, Any], baselines: Iterable[dict[str, Any]]) -> list[str] | None:
    """The comparison-key settings in which the closest baseline run differs from `summary`
    (empty: one matches), or None when there is no baseline run at all."""
    found = [key_differences(summary.get("comparison_key"), other.get("comparison_key")) for other in baselines]
    return min(found, key=len) if found else None


def missing_speedup_reason(summary: dict[str, Any], comparison_root: str | Path) -> str | None:
    """Why `summary`'s speedup is empty, from the baseline runs under `comparison_root` (None: it
    is not, or `summary` is the baseline's own): summary.json keeps it as `speedup_missing`."""
    if summary.get("speedup") is not None or summary.get("method") == baseline_method():
        return None
    name = baseline_method()
    differences = nearest_differences(summary, [s for s in find_summaries(comparison_root) if s.get("method") == name])
    if differences is None:
        return f"no {name} run under {comparison_root} yet"
    if differences:
        return f"no {name} run under {comparison_root} has this run's comparison key (the nearest differs in: {', '.join(differences)})"
    return f"the matching {name} run under {comparison_root} has no latency (no samples)"


def missing_baseline_note(summary: dict[str, Any], overrides: Sequence[str]) -> str | None:
    """Why `speedup` is empty (the summary's `speedup_missing`) and the command that fills it, or None."""
    why = summary.get("speedup_missing")
    if not why:
        return None
    return f"speedup -: {why}; make it with\n  {baseline_command(overrides)}\nor rerun with baseline=auto, which runs it first"
