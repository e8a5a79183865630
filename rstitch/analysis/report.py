"""A report over a set of runs: the runs table, frontiers and matched-accuracy speedups, the papers'
tables and figures; written as self-contained HTML (figures embedded) or Markdown (figures in a
sibling directory), its tables as LaTeX, and optionally logged to W&B."""
from __future__ import annotations

import base64
import functools
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from rstitch.analysis import plots, tables, traces
from rstitch.analysis.collect import BASELINE, is_baseline, load_samples, paired_with_baseline
from rstitch.analysis.frontier import curve_pairs, mark_frontier, matched_speedup_summary
from rstitch.errors import ConfigError
from rstitch.methods import BASELINE_ROLES, METHODS, baseline_method
from rstitch.results.measurement import CONTENTION_ADVICE, robust_figure
from rstitch.results.uncertainty import with_intervals

FORMATS = (".html", ".md")


@dataclass
class ReportFigure:
    name: str  # file stem
    caption: str
    figure: Figure

    @functools.cached_property
    def png(self) -> bytes:
        return plots.png_bytes(self.figure)


@dataclass
class Section:
    title: str
    text: str = ""
    tables: list[tables.Table] = field(default_factory=list)
    figures: list[ReportFigure] = field(default_factory=list)


@dataclass
class Report:
    title: str
    sections: list[Section] = field(default_factory=list)

    def all_tables(self) -> list[tables.Table]:
        return [t for s in self.sections for t in s.tables]

    def all_figures(self) -> list[ReportFigure]:
        return [f for s in self.sections for f in s.figures]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=]+", "_", text).strip("_")


def build_report(runs: pd.DataFrame, latency: str = "latency_s", entropy: bool = False,
                 entropy_samples: int | None = None, title: str = "rstitch results") -> Report:
    """Every section the runs support; `entropy` loads the pair's SLM to score the stored traces."""
    runs = mark_frontier(runs, latency)
    samples = load_samples(runs)
    runs = with_intervals(runs, samples, latency)  # error bars, paired comparisons, frontier shares
    paired = paired_with_baseline(samples) if (samples["method"] == BASELINE).any() else samples.iloc[:0]
    paper_tables = [*tables.accuracy_latency_tables(runs, latency), *tables.token_tables(runs), *tables.benchmark_accuracy_tables(runs)]
    sections = [Section("Runs", contention_text(runs), tables=[tables.runs_table(runs, latency)]), _frontier_section(runs, latency),
                Section("Paper tables", tables=paper_tables), _acceptance_section(runs), _sample_speedup_section(runs, paired)]
    if entropy:
        sections += [_entropy_section(runs, entropy_samples), _consistency_section(runs, paired, entropy_samples)]
    return Report(title, sections)


def contention_text(runs: pd.DataFrame) -> str:
    """The runs whose latency was measured under contention, why, and what to do (empty if none)."""
    flagged = runs[runs["contention"].notna()] if "contention" in runs else runs.iloc[:0]
    if flagged.empty:
        return ""
    held = ("speedup_estimate", "speedup_cpu", "latency_cpu_s")  # what of a contended run still holds
    listed = "; ".join(f"{run['method']} {run['setting']} ({run['group']}): {run['contention']}"
                       + robust_figure({k: None if pd.isna(run.get(k)) else run.get(k) for k in held if k in run.index})
                       for _, run in flagged.iterrows())
    advice = CONTENTION_ADVICE[0].upper() + CONTENTION_ADVICE[1:]
    return f"Latency measured under contention in {len(flagged)} of {len(runs)} runs: {listed}. {advice}."


def _frontier_section(runs: pd.DataFrame, latency: str) -> Section:
    section = Section("Accuracy vs latency",
                      "Each run is one point with 95% intervals on both axes (bootstrap over problems for latency, "
                      "Wilson clustered by problem for accuracy); ringed points are on the Pareto frontier of their "
                      "group (all methods), labelled with the share of bootstrap resamples of the problems in which "
                      "they stay on it (other points: that share where it is 20% or more); grey crosses are random routing.")
    for group in runs["group"].unique():
        section.figures.append(ReportFigure(f"accuracy_latency_{slug(group)}", f"Accuracy vs latency: {group}",
                                            plots.accuracy_latency_figure(runs, group, latency)))
    summary = matched_speedup_summary(runs, curve_pairs(runs), latency)
    if len(summary):
        section.tables.append(tables.matched_speedup_table(summary))
    return section


def _acceptance_section(runs: pd.DataFrame) -> Section:
    section = Section("Accuracy vs acceptance rate",
                      "Acceptance counts drafted steps kept (step-level methods), draft tokens kept "
                      "(speculative decoding), or the SLM's share of the output tokens (token-level hybrids).")
    hybrids = runs[~runs["method"].map(is_baseline) & runs["acceptance"].notna()]
    for group in hybrids["group"].unique():
        section.figures.append(ReportFigure(f"accuracy_acceptance_{slug(group)}", f"Accuracy vs acceptance: {group}",
                                            plots.accuracy_acceptance_figure(runs, group)))
    if not section.figures:
        section.text = "No hybrid run reports an acceptance rate."
    return section


def representative_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per group and non-baseline method, its most accurate run (the fastest among ties)."""
    candidates = runs[runs["method"] != BASELINE].sort_values(["accuracy", "latency_s"], ascending=[False, True])
    return candidates.groupby(["comparison", "method"], sort=False).head(1).sort_index()


def _sample_speedup_section(runs: pd.DataFrame, paired: pd.DataFrame) -> Section:
    section = Section("Per-problem speedup",
                      f"Per method and group, its most accurate run against {BASELINE} on the same problems.")
    for _, run in representative_runs(runs).iterrows():
        mine = paired[paired["run_dir"] == run["run_dir"]]
        if mine.empty:
            continue
        label = f"{run['method']} {run['setting']}".strip()
        section.figures.append(ReportFigure(
            f"sample_speedup_{slug(run['group'])}_{slug(label)}", f"Per-problem speedup: {label}, {run['group']}",
            plots.sample_speedup_figure(mine, f"{label} — {run['group']}")))
    if not section.figures:
        section.text = f"Needs an {BASELINE} run and another run of the same comparison."
    return section


def _entropy_section(runs: pd.DataFrame, max_samples: int | None) -> Section:
    section = Section("Entropy of correct and incorrect traces",
                      "The traces of the single-model runs scored by the SLM: normalized entropy H / log V at each "
                      "output position; dotted lines are the R-Stitch thresholds of the group's runs.")
    rows: list[list[Any]] = []
    single = runs[runs["method"].map(is_baseline)]  # the single-model runs, whose traces the SLM scores
    for (group, method), block in single.groupby(["group", "method"], sort=False):
        scored = traces.token_scores(block, "slm", max_samples)
        taus = entropy_thresholds(runs[runs["group"] == group])
        section.figures.append(ReportFigure(
            f"entropy_{slug(group)}_{method}", f"SLM entropy of {method} traces: {group}",
            plots.entropy_figure(scored, f"{method} traces scored by the SLM — {group}", taus)))
        rows += _entropy_rows(f"{group} / {method}", scored, taus)
    if rows:
        columns = [tables.Column("Traces of"), tables.Column("Outcome"), tables.Column("n traces", "count"),
                   tables.Column("n tokens", "count"), tables.Column("Mean entropy", "number"), tables.Column("Tokens above tau (%)")]
        section.tables.append(tables.Table("SLM entropy of correct and incorrect traces", columns, rows,
                                           note="Mean entropy: mean over traces of the per-trace mean normalized entropy."))
    else:
        section.text = f"Needs a {' or '.join(baseline_method(r) for r in BASELINE_ROLES)} run."
    return section


def entropy_thresholds(runs: pd.DataFrame) -> list[float]:
    """The entropy thresholds tau of the R-Stitch runs among `runs`."""
    stitch = runs[runs["method"].isin(("rstitch", "rstitch_plus"))]
    return sorted({float(t) for t in stitch.get("method.tau", pd.Series(dtype=float)).dropna()})


def _entropy_rows(group: str, scored: pd.DataFrame, taus: list[float]) -> list[list[Any]]:
    per_trace = traces.trace_entropy(scored)
    rows = []
    for name, flag in (("correct", True), ("incorrect", False)):
        tokens = scored[scored["correct"] == flag]["normalized_entropy"]
        trace_means = per_trace[per_trace["correct"] == flag]["mean_entropy"]
        above = " ".join(f"{tau:g}:{100 * float((tokens > tau).mean()):.1f}" for tau in taus) if len(tokens) else ""
        rows.append([group, name, len(trace_means), len(tokens), trace_means.mean() if len(trace_means) else None, above])
    return rows


def _consistency_section(runs: pd.DataFrame, paired: pd.DataFrame, max_samples: int | None) -> Section:
    section = Section("Speculative decoding speedup vs token consistency",
                      f"Token consistency: along each {BASELINE} trace, the share of positions where the SLM's "
                      "greedy token (same prefix) equals the LLM's token.")
    speculative = runs[runs["acceptance_kind"] == "draft tokens"]
    with_baseline = runs[runs["comparison"].isin(speculative["comparison"])]
    if speculative.empty or not (with_baseline["method"] == BASELINE).any():
        speculative_methods = ", ".join(sorted(m for m, cls in METHODS.items() if cls.family == "speculative"))
        section.text = f"Needs a speculative run ({speculative_methods}) and the {BASELINE} run of its comparison."
        return section
    consistency = traces.token_consistency(with_baseline, max_samples)
    points, run_points = traces.speedup_vs_consistency(runs, paired, consistency)
    section.figures.append(ReportFigure("speedup_consistency", "Speedup vs token consistency",
                                        plots.speedup_consistency_figure(points, run_points)))
    return section


def write_report(report: Report, path: str | Path) -> list[Path]:
    """Write `report` as .html (self-contained) or .md (figures in `<stem>_files/`); returns the files written."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ConfigError(f"report file must end in {' or '.join(FORMATS)}, got '{path.name}'")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".html":
        path.write_text(_html(report))
        return [path]
    figure_dir = path.with_name(f"{path.stem}_files")
    figure_dir.mkdir(exist_ok=True)
    written = [figure_dir / f"{figure.name}.png" for figure in report.all_figures()]
    for target, figure in zip(written, report.all_figures()):
        target.write_bytes(figure.png)
    path.write_text(_markdown(report, figure_dir.name))
    return [path, *written]


def write_latex(report: Report, path: str | Path) -> Path:
    """Every table of the report as a LaTeX table (booktabs), one after another."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "% Generated by rstitch-report; needs \\usepackage{booktabs}.\n"
    path.write_text(header + "\n".join(t.to_latex() for t in report.all_tables()))
    return path


def _markdown(report: Report, figure_dir: str) -> str:
    parts = [f"# {report.title}\n"]
    for section in report.sections:
        parts.append(f"## {section.title}\n")
        if section.text:
            parts.append(section.text + "\n")
        parts += [f"![{f.caption}]({figure_dir}/{f.name}.png)\n" for f in section.figures]
        parts += [t.to_markdown() for t in section.tables]
    return "\n".join(parts)


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,td:nth-child(2){text-align:left}img{max-width:100%;display:block;margin:.5em 0}
.note{font-size:12px;color:#555}figcaption{font-size:12px;color:#555;margin-bottom:1.5em}"""


def _html(report: Report) -> str:
    body = [f"<h1>{html.escape(report.title)}</h1>"]
    for section in report.sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.text:
            body.append(f"<p>{html.escape(section.text)}</p>")
        for figure in section.figures:
            data = base64.b64encode(figure.png).decode()
            body.append(f"<figure><img alt='{html.escape(figure.caption)}' src='data:image/png;base64,{data}'>"
                        f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>")
        body += [t.to_html() for t in section.tables]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")


def wandb_table(table: tables.Table):
    import wandb

    columns: list[str | int] = [c.header for c in table.columns]
    # A column with intervals (cells that are tuples) is logged as its rendered text: one type per column.
    as_text = [any(isinstance(row[i], tuple) for row in table.rows) for i in range(len(table.columns))]
    rendered = table.cells(0)
    data = [[text if flag else value for value, text, flag in zip(row, shown, as_text)] for row, shown in zip(table.rows, rendered)]
    return wandb.Table(columns=columns, data=data)


def wandb_image(figure: ReportFigure):
    import io

    import wandb
    from PIL import Image

    return wandb.Image(Image.open(io.BytesIO(figure.png)), caption=figure.caption)


def log_report(report: Report, run) -> None:
    """Log every figure (as an image) and table of `report` to the open W&B `run`."""
    payload = {f"figures/{f.name}": wandb_image(f) for f in report.all_figures()}
    payload.update({f"tables/{slug(t.title)}": wandb_table(t) for t in report.all_tables()})
    run.log(payload)
