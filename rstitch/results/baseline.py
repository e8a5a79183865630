"""The baseline of a run's speedup: why a speedup is missing, the command that makes the baseline,
and the configuration `baseline=auto` runs (or resumes) before the method."""
from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstitch.configs import override_key
from rstitch.errors import ConfigError
from rstitch.results.keys import RunIdentity, comparison_dir, identify, key_differences
from rstitch.results.metrics import baseline_method
from rstitch.results.store import run_summaries


def wants_baseline_run(cfg: dict[str, Any]) -> bool:
    """True when `baseline=auto` asks for the baseline run before this one (not for the baseline itself)."""
    choice = cfg.get("baseline")  # the top-level knob: it is not part of any run key
    if choice not in (None, "auto"):
        raise ConfigError(f"baseline must be null or auto, got {choice!r}")
    return choice == "auto" and cfg["method"]["name"] != baseline_method()


def baseline_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` with the baseline method, as `rstitch-run method=<baseline>` composes it: the same comparison key and problems."""
    from omegaconf import OmegaConf

    from rstitch.configs import CONF_DIR

    method = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "method" / f"{baseline_method()}.yaml"), resolve=True)
    return {**cfg, "method": method}


def planned_runs(cfg: dict[str, Any], results_root: str | Path, run_dir: str | Path | None = None) -> list[RunIdentity]:
    """The runs a composed config (without `results_root` and `logger`) makes: with `baseline=auto` its baseline first
    (run, or resumed: a finished one decodes nothing), so that its speedup is filled; then its own, in `run_dir` if given."""
    root = comparison_dir(results_root, cfg)
    baseline = [identify(baseline_config(cfg), root)] if wants_baseline_run(cfg) else []
    return [*baseline, identify(cfg, root, run_dir)]


def is_method_override(override: str) -> bool:
    """`method=...`, `method.tau=...` (also with + or ~) and `baseline=...`: the settings a baseline run does not share."""
    key = override_key(override)
    return key in ("method", "baseline") or key.startswith("method.")


def missing_speedup_reason(summary: dict[str, Any], comparison_root: str | Path) -> str | None:
    """Why `summary`'s speedup is empty (None: it is not, or `summary` is the baseline's own), from the baseline runs
    under `comparison_root`: the settings the nearest differs in. summary.json keeps it as `speedup_missing`."""
    name = baseline_method()
    if summary.get("speedup") is not None or summary.get("method") == name:
        return None
    found = [key_differences(summary.get("comparison_key"), s.get("comparison_key")) for _, s in run_summaries(comparison_root)
             if s.get("method") == name]
    if not found:
        return f"no {name} run under {comparison_root} yet"
    differences = min(found, key=len)
    if differences:
        return f"no {name} run under {comparison_root} has this run's comparison key (the nearest differs in: {', '.join(differences)})"
    return f"the matching {name} run under {comparison_root} has no latency (no samples)"


def missing_baseline_note(summary: dict[str, Any], overrides: Sequence[str]) -> str | None:
    """Why `speedup` is empty (the summary's `speedup_missing`) and the command that fills it, or None."""
    why = summary.get("speedup_missing")
    if not why:
        return None
    command = " ".join(["rstitch-run", f"method={baseline_method()}", *(shlex.quote(o) for o in overrides if not is_method_override(o))])
    return f"speedup -: {why}; make it with\n  {command}\nor rerun with baseline=auto, which runs it first"
