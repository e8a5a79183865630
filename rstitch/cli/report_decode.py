"""Decode a report (analysis/record_reports.py) problem by problem, every row of a problem in turn, for at most
some minutes; each problem's records are written at once, so a later call (any machine, a fresh clone) goes on
from the first problem a row lacks. Each call that decodes is a sitting, labelled with machine, build, threads."""
from __future__ import annotations

import os
import platform
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rstitch.analysis.record_reports import (
    PAGE,
    compact,
    finished_problems,
    load_manifest,
    read_records,
    render_page,
    run_id,
    write_manifest,
    write_records,
)
from rstitch.config_groups import compose_config
from rstitch.data import load_dataset_records
from rstitch.errors import ConfigError
from rstitch.results import keys
from rstitch.results.keys import comparison_dir, identify
from rstitch.results.store import iter_samples, write_samples
from rstitch.runner import decode, plan

ROOT = Path(__file__).resolve().parents[2]
clock = time.monotonic  # the minutes a decode may take are counted on it


@dataclass
class ReportSpec:
    """What a report decodes: rows (method, settings), shared overrides, tables (title -> rows), columns, words."""

    title: str
    description: str
    command: str
    overrides: list[str]
    rows: list[tuple[str, dict[str, Any]]]
    tables: list[tuple[str, list[tuple[str, dict[str, Any]]]]]
    columns: list[str]


def machine_label() -> str:
    cpuinfo = Path("/proc/cpuinfo")  # Linux names the CPU model there; platform.processor() is often empty
    found = re.search(r"^model name\s*:(.*)$", cpuinfo.read_text(), re.M) if cpuinfo.is_file() else None
    model = found.group(1).strip() if found else platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} CPUs"


def build_label() -> str:
    """The commit decoding, and whether the decoding code differs from it in this checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" + local changes" if git("status", "--porcelain", "--", "rstitch", "conf") else "")


def checked_manifest(folder: Path, spec: ReportSpec, cfgs: dict[str, dict[str, Any]], problems: list[str]) -> dict[str, Any]:
    """The folder's manifest (new for a new folder); one error line when its records were decoded otherwise."""
    fresh = {
        "title": spec.title, "description": spec.description, "command": spec.command, "overrides": spec.overrides,
        "runs": {run_id(m, p): {"method": m, "params": p, "method_cfg": cfgs[run_id(m, p)]["method"]} for m, p in spec.rows},
        "tables": [{"title": t, "runs": [run_id(m, p) for m, p in rows]} for t, rows in spec.tables],
        "columns": spec.columns, "problems": problems, "sittings": [],
    }
    if not (folder / "report.json").is_file():
        return fresh
    manifest = load_manifest(folder)
    for key in ("overrides", "runs", "problems"):
        if manifest[key] != fresh[key]:
            raise ConfigError(f"{folder} was decoded with other {key}; decode into a new folder or delete this one")
    return {**fresh, "sittings": manifest["sittings"]}


def decode_first(cfg: dict[str, Any], problems: int) -> None:
    """Decode what `cfg`'s run lacks of its first `problems` problems; a report's rows are not whole runs, so no
    summary is written and nothing is logged."""
    root = comparison_dir(cfg["results_root"], cfg)
    run_cfg = {k: v for k, v in cfg.items() if k not in ("results_root", "logger")}
    with plan(identify(run_cfg, root), problems=problems) as planned:
        decode(planned)


def decode_problem(folder: Path, cfgs: dict[str, dict[str, Any]], index: int, problem: str, sitting: int) -> None:
    """Every row's sample of one problem, each written into the report as soon as it is decoded."""
    for run, cfg in cfgs.items():
        kept = read_records(folder, run)
        if any(r["id"] == problem for r in kept):
            continue
        run_dir = keys.run_dir(cfg["results_root"], cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_samples(run_dir, kept)  # the scratch run holds the records: the runner decodes only what they lack
        decode_first(cfg, index + 1)
        new = [s for s in iter_samples(run_dir / "samples.jsonl") if s["id"] == problem]
        write_records(folder, run, [*kept, *(compact(s, sitting) for s in new)])


def prepared(folder: Path, spec: ReportSpec, scratch: str) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, Any]]:
    """The rows' configs (runs under `scratch`), the problems in order, and the folder's manifest, checked and written."""
    cfgs = {run_id(m, p): compose_config([*spec.overrides, f"results_root={scratch}", "logger=none", f"method={m}",
                                          *(f"method.{k}={v}" for k, v in p.items())]) for m, p in spec.rows}
    problems = [str(r.id) for r in load_dataset_records(**next(iter(cfgs.values()))["dataset"])]
    manifest = checked_manifest(folder, spec, cfgs, problems)
    write_manifest(folder, manifest)
    return cfgs, problems, manifest


def refresh_page(folder: Path, spec: ReportSpec) -> None:
    """Rewrite a report's words from `spec` and its page from its records, decoding nothing."""
    if not (folder / "report.json").is_file():
        raise ConfigError(f"{folder} is not a report yet: decode it first")
    kept = replace(spec, command=load_manifest(folder)["command"])  # the command that decoded the records
    with tempfile.TemporaryDirectory(prefix="report-") as scratch:
        prepared(folder, kept, scratch)
    (folder / PAGE).write_text(render_page(folder))


def decode_report(folder: Path, spec: ReportSpec, minutes: float) -> int:
    """Decode the missing problems in order while this sitting's longest still fits in `minutes`; rewrite the page."""
    if minutes <= 0:
        raise ConfigError(f"--minutes must be > 0, got {minutes}")
    with tempfile.TemporaryDirectory(prefix="report-") as scratch:
        cfgs, problems, manifest = prepared(folder, spec, scratch)
        first = next(iter(cfgs.values()))
        done = set(finished_problems(manifest, folder))
        start, longest, decoded = clock(), 0.0, 0
        for index, problem in enumerate(problems):
            if problem in done:
                continue
            if clock() - start + longest > minutes * 60:
                break
            if decoded == 0:
                manifest["sittings"].append({"started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
                                             "machine": machine_label(), "commit": build_label(),
                                             "threads": first["engine"].get("num_threads")})
                write_manifest(folder, manifest)
            began = clock()
            decode_problem(folder, cfgs, index, problem, len(manifest["sittings"]))
            longest, decoded = max(longest, clock() - began), decoded + 1
    (folder / PAGE).write_text(render_page(folder))
    return decoded
