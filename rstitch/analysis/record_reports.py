"""A results report: a folder (docs/reports/<name>/) whose page, README.md, is generated from what it keeps alone:
`report.json` (command, runs, tables, problems, sittings), `records/<run>.jsonl.gz` (every sample, token ids
dropped, text kept for regrading) and `readings.md` (prose whose every figure is an expression over the runs'
summaries, `{{ rstitch[tau=0.02].speedup :.2f }}`). A run's summary is computed from its records as
`rstitch-run` computes it, paired with the report's `llm_only` run on the same problems."""
from __future__ import annotations

import ast
import gzip
import io
import json
import operator
import re
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rstitch.analysis.collect import BASELINE
from rstitch.analysis.tables import number_format
from rstitch.errors import ConfigError
from rstitch.methods import build_method
from rstitch.results.metrics import (
    COMPARISON_KEYS,
    paired_statistics,
    self_comparison,
    speedup_split,
    speedups_against,
    summarize_samples,
)
from rstitch.results.store import atomic_write

MANIFEST = "report.json"
READINGS = "readings.md"
PAGE = "README.md"
RECORDS = "records"
DROPPED_KEYS = ("output_token_ids", "token_sources")  # the text stays: `response` is what is graded
EXPRESSION = re.compile(r"\{\{(?P<expr>.*?)(?::(?P<fmt>[^:{}]*))?\}\}", re.S)
# A number standing alone (1.42x, 0.975, 8%, -0.100, 1,240), not a part of a name (GSM8K, MATH500, 0.5B).
FIGURE = re.compile(r"(?<![A-Za-z0-9_.])\d+(?:[.,]\d+)*(?:x|%)?(?!\.?[A-Za-z0-9])")
REFERENCE = re.compile(r"(?P<method>[a-z_]+)(?:\[(?P<setting>[^\]]*)\])?\.(?P<key>[a-z_0-9]+)")
OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def run_id(method: str, params: dict[str, Any]) -> str:
    """A run's name in a report: its method and the settings it overrides (`rstitch-tau=0.02`)."""
    return "-".join([method, *(f"{k}={v}" for k, v in params.items())])


def setting_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def compact(sample: dict[str, Any], sitting: int) -> dict[str, Any]:
    """A sample as a report keeps it: without its token ids, with the sitting that decoded it."""
    return {**{k: v for k, v in sample.items() if k not in DROPPED_KEYS}, "sitting": sitting}


def records_path(folder: Path, run: str) -> Path:
    return folder / RECORDS / f"{run}.jsonl.gz"


def read_records(folder: Path, run: str) -> list[dict[str, Any]]:
    path = records_path(folder, run)
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_records(folder: Path, run: str, rows: list[dict[str, Any]]) -> None:
    """Replace a run's records at once; the same rows give the same bytes (no timestamp in the header)."""
    path = records_path(folder, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as f:
        f.write("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode())
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(path)


def load_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{folder} is not a report: no {MANIFEST}")
    return json.loads(path.read_text())


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=False) + "\n")


def summarize_records(method_cfg: dict[str, Any], samples: list[dict[str, Any]],
                      baseline_samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's summary from its records and its baseline's over the same problems."""
    method = build_method(**method_cfg)
    summary: dict[str, Any] = {"method": method.name, **summarize_samples(samples), **dict.fromkeys(COMPARISON_KEYS)}
    summary.update(method.summarize(samples))
    if method.name == BASELINE:
        summary.update(self_comparison(summary))
    elif baseline_samples:
        baseline = summarize_samples(baseline_samples)
        summary.update(speedups_against(summary, baseline))
        summary.update(speedup_split(summary, baseline, summary["speedup"]))
        summary.update(paired_statistics(samples, baseline_samples))
    return summary


def finished_problems(manifest: dict[str, Any], folder: Path) -> list[str]:
    """The problems every run of the report holds, in decode order: a table compares only these."""
    held = [{r["id"] for r in read_records(folder, run)} for run in manifest["runs"]]
    return [p for p in manifest["problems"] if all(p in ids for ids in held)]


def report_summaries(manifest: dict[str, Any], folder: Path) -> dict[str, dict[str, Any]]:
    """Every run's summary over the problems all runs finished, with its settings and sittings."""
    problems = set(finished_problems(manifest, folder))
    rows = {run: [r for r in read_records(folder, run) if r["id"] in problems] for run in manifest["runs"]}
    base = next((run for run, spec in manifest["runs"].items() if spec["method"] == BASELINE), None)
    baseline_rows = rows[base] if base else []
    out = {}
    for run, spec in manifest["runs"].items():
        summary: dict[str, Any] = summarize_records(spec["method_cfg"], rows[run], baseline_rows) if rows[run] else {}
        summary.update(spec["params"])
        summary["sittings"] = sorted({r["sitting"] for r in rows[run]})
        out[run] = summary
    return out


def sitting_measures(manifest: dict[str, Any], folder: Path) -> dict[int, dict[str, float]]:
    """Per sitting, from its samples: CPU-seconds per wall second, mean 1-minute load, problems decoded."""
    rows = [r for run in manifest["runs"] for r in read_records(folder, run)]
    out = {}
    for sitting in sorted({r["sitting"] for r in rows}):
        mine = [r for r in rows if r["sitting"] == sitting]
        cpu = [r.get("measurement", {}).get("cpu_s") for r in mine]
        wall = sum(r["latency_s"] for r in mine)
        cpu_per_wall = sum(cpu) / wall if None not in cpu and wall > 0 else float("nan")
        loads = [r["measurement"]["load_1m"] for r in mine if r.get("measurement", {}).get("load_1m") is not None]
        out[sitting] = {"cpu_per_wall": cpu_per_wall,
                        "load": statistics.fmean(loads) if loads else float("nan"),
                        "problems": len({r["id"] for r in mine})}
    return out


def lookup(summaries: dict[str, dict[str, Any]], manifest: dict[str, Any], ref: re.Match) -> Any:
    """The value `method[setting].key` names; one error naming the reference when it names nothing."""
    wanted = (ref.group("method"), ref.group("setting") or "")
    runs = [run for run, spec in manifest["runs"].items() if (spec["method"], setting_text(spec["params"])) == wanted]
    if len(runs) != 1:
        raise ConfigError(f"{ref.group(0)}: no run {wanted[0]}[{wanted[1]}] in the report")
    summary = summaries[runs[0]]
    if summary.get(ref.group("key")) is None:
        raise ConfigError(f"{ref.group(0)}: the run has no value for {ref.group('key')!r}")
    return summary[ref.group("key")]


def evaluate(expression: str, summaries: dict[str, dict[str, Any]], manifest: dict[str, Any],
             names: dict[str, Any]) -> Any:
    """Arithmetic (+ - * /, unary -, a subscript [i]) over references and the report's names."""
    scope = dict(names)

    def substitute(m: re.Match) -> str:  # each reference becomes a name bound to its value
        name = f"__ref{len(scope)}"
        scope[name] = lookup(summaries, manifest, m)
        return name

    tree = ast.parse(REFERENCE.sub(substitute, expression.strip()), mode="eval")

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in scope:
            return scope[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Subscript):
            return value(node.value)[value(node.slice)]
        raise ConfigError(f"not arithmetic on the report's figures: {expression.strip()!r}")

    return value(tree.body)


def unchecked_figures(template: str) -> list[str]:
    """The digits of a readings template outside `{{ }}`: figures no record computes."""
    prose = EXPRESSION.sub("", template)
    return [prose[max(0, m.start() - 30):m.end() + 10].replace("\n", " ") for m in FIGURE.finditer(prose)]


def expand_readings(template: str, summaries: dict[str, dict[str, Any]], manifest: dict[str, Any],
                    names: dict[str, Any]) -> str:
    """The readings with each `{{ expression :format }}` replaced by its value."""
    unchecked = unchecked_figures(template)
    if unchecked:
        raise ConfigError(f"a figure in the readings is not computed from the records: {unchecked[0]!r}")

    def render(m: re.Match) -> str:
        result = evaluate(m.group("expr"), summaries, manifest, names)
        return format(result, (m.group("fmt") or "").strip())

    return EXPRESSION.sub(render, template)


def _cell(key: str, fmt: str, spread: str = "") -> Callable[[dict[str, Any]], str]:
    """A summary's `key` as the tables render it: `value ± se` (spread "se") or `value [low, high]` ("ci")."""
    render = number_format(fmt)

    def cell(summary: dict[str, Any]) -> str:
        extra = summary.get(f"{key}_{spread}") if spread else None
        spreads = () if extra is None else (extra,) if spread == "se" else tuple(extra)  # an interval is [low, high]
        return render((summary.get(key), *spreads))[0]

    return cell


# column -> (header, cell)
COLUMNS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "n": ("problems", _cell("n_problems", "{}")),
    "accuracy": ("accuracy ± se", _cell("accuracy", "{:.3f}", "se")),
    "accuracy_diff": ("Δ accuracy vs llm_only ± se", _cell("accuracy_diff", "{:+.3f}", "se")),
    "p": ("p (paired)", _cell("accuracy_diff_p", "{:.2g}")),
    "latency": ("latency (s)", _cell("latency_s", "{:.3f}")),
    "estimate_speedup": ("estimated speedup [95% CI]", _cell("speedup_estimate", "{:.2f}", "ci")),
    "speedup": ("wall speedup [95% CI]", _cell("speedup", "{:.2f}", "ci")),
    "cpu_speedup": ("CPU-time speedup [95% CI]", _cell("speedup_cpu", "{:.2f}", "ci")),
    "token_ratio": ("token ratio [95% CI]", _cell("token_ratio", "{:.2f}", "ci")),
    "per_token_ratio": ("per-token ratio [95% CI]", _cell("per_token_latency_ratio", "{:.2f}", "ci")),
    "share": ("LLM token share", _cell("llm_token_share", "{:.3f}")),
    "tokens": ("tokens", _cell("tokens", "{:.1f}")),
    "slm_tokens": ("SLM tokens", _cell("tokens_slm", "{:.1f}")),
    "llm_tokens": ("LLM tokens", _cell("tokens_llm", "{:.1f}")),
    "switches": ("switches", _cell("switches", "{:.2f}")),
    "spec_acceptance": ("spec acceptance rate", _cell("spec_acceptance_rate", "{:.3f}")),
    "acceptance": ("step acceptance rate", _cell("acceptance_rate", "{:.3f}")),
    "gflops": ("GFLOPs", lambda s: "-" if s.get("flops") is None else f"{s['flops'] / 1e9:.2f}"),
    "sittings": ("sittings", lambda s: ", ".join(str(i) for i in s.get("sittings", [])) or "-"),
}


def markdown_table(headers: list[str], rows: Iterable[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(row) + " |" for row in rows)]


# The speedups, in the order a table leads with them: the latency model's estimate (counted forwards
# priced by a profile, which other jobs on the cores do not move), then CPU time, then wall clock.
SPEEDUP_COLUMNS = ("estimate_speedup", "cpu_speedup", "speedup")
ESTIMATE_NOTE = ("The estimated speedup is `llm_only`'s `latency_estimate_s` over the row's: the forwards each decode "
                 "ran, each at its cost in the latency model's profile, which other jobs on the cores do not change "
                 "([analysis.md](../../analysis.md)), so the tables lead with it; its interval pairs the problems as the others do.")


def table_columns(columns: list[str]) -> list[str]:
    """The report's columns with every speedup, in SPEEDUP_COLUMNS order, where it lists its first (a column
    without values is dropped later, so a report without a latency model shows no estimate)."""
    first = next((i for i, c in enumerate(columns) if c in SPEEDUP_COLUMNS), None)
    if first is None:
        return list(columns)
    rest = [c for c in columns if c not in SPEEDUP_COLUMNS]  # the first `first` of them precede every speedup
    speedups = [c for c in SPEEDUP_COLUMNS if c == "estimate_speedup" or c in columns]
    return [*rest[:first], *speedups, *rest[first:]]


def shown_columns(manifest: dict[str, Any], summaries: dict[str, dict[str, Any]], runs: list[str]) -> list[str]:
    """The columns a table shows: the report's (speedups led by the estimate) that a run has a value in."""
    return [c for c in table_columns(manifest["columns"])
            if c in COLUMNS and any(COLUMNS[c][1](summaries[run]) != "-" for run in runs)]


def run_table(manifest: dict[str, Any], summaries: dict[str, dict[str, Any]], runs: list[str]) -> list[str]:
    """The runs' rows in the columns `shown_columns` keeps."""
    columns = shown_columns(manifest, summaries, runs)
    rows = [[manifest["runs"][run]["method"], setting_text(manifest["runs"][run]["params"]),
             *(COLUMNS[c][1](summaries[run]) for c in columns)] for run in runs]
    return markdown_table(["method", "setting", *(COLUMNS[c][0] for c in columns)], rows)


def sittings_table(manifest: dict[str, Any], folder: Path) -> list[str]:
    measured = sitting_measures(manifest, folder)
    rows = []
    for i, sitting in enumerate(manifest["sittings"], start=1):
        m = measured.get(i, {"cpu_per_wall": float("nan"), "load": float("nan"), "problems": 0})
        rows.append([str(i), sitting["started"], sitting["machine"], sitting["commit"], str(sitting["threads"]),
                     f"{m['cpu_per_wall']:.2f}", f"{m['load']:.1f}", str(m["problems"])])
    return markdown_table(["sitting", "started (UTC)", "machine", "build (commit)", "threads",
                           "CPU-s per wall s", "mean 1-min load", "problems"], rows)


SITTING_FIELDS = ("machine", "commit", "threads")


def sittings_note(manifest: dict[str, Any]) -> str:
    """Where the sittings differ (a speedup pairs a problem's rows, decoded in one sitting)."""
    if len(manifest["sittings"]) < 2:
        return "One sitting decoded every row."
    differ = [f for f in SITTING_FIELDS if len({str(s[f]) for s in manifest["sittings"]}) > 1]
    which = f"they differ in {', '.join(differ)}" if differ else "they share machine, build and threads"
    return (f"{len(manifest['sittings'])} sittings decoded these rows ({which}, and in CPU-seconds per wall second "
            "and load, above); each problem's rows were decoded in one sitting, so a speedup pairs timings taken together.")


def render_page(folder: Path) -> str:
    """README.md of a report, from its manifest, records and readings alone."""
    manifest = load_manifest(folder)
    summaries = report_summaries(manifest, folder)
    done = finished_problems(manifest, folder)
    names: dict[str, Any] = {"problems": len(done), "planned": len(manifest["problems"]), "sittings": len(manifest["sittings"])}
    for sitting, measured in sitting_measures(manifest, folder).items():  # `cpu_per_wall_1`, `load_1`, ...
        names.update({f"{key}_{sitting}": value for key, value in measured.items()})
    lines = [f"# {manifest['title']}", "", "Generated from this folder's records by", "", "```",
             manifest["command"], "```", "",
             f"{len(done)} of {len(manifest['problems'])} planned problems are decoded for every row. "
             + manifest["description"], "", "## Sittings", "", *sittings_table(manifest, folder), "",
             sittings_note(manifest)]
    for table in manifest["tables"]:
        lines += ["", f"## {table['title']}", "", *run_table(manifest, summaries, table["runs"])]
    if any("estimate_speedup" in shown_columns(manifest, summaries, t["runs"]) for t in manifest["tables"]):
        lines += ["", ESTIMATE_NOTE]
    readings = folder / READINGS
    if readings.is_file() and done:
        lines += ["", "## Readings", "", expand_readings(readings.read_text(), summaries, manifest, names).rstrip()]
    return "\n".join(lines) + "\n"
