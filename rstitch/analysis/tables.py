"""Tables in the papers' layouts, rendered as Markdown or LaTeX (booktabs)."""
from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rstitch.analysis.collect import BASELINE, dataset_labels
from rstitch.methods import method_rank

Formatter = Callable[[Any], tuple[str, str]]  # value -> (markdown, latex)


def number_format(fmt: str, suffix_md: str = "", suffix_tex: str = "") -> Formatter:
    """A number; `(value, se)` as `value ± se`, `(value, low, high)` as `value [low, high]` (missing ones left out)."""
    def render(value: Any) -> tuple[str, str]:
        estimate, *spread = value if isinstance(value, tuple) else (value,)
        if pd.isna(estimate):
            return "-", "--"
        text = fmt.format(estimate)
        md, tex = text + suffix_md, text + suffix_tex
        if len(spread) == 1 and not pd.isna(spread[0]):
            error = fmt.format(spread[0]).lstrip("+")
            md, tex = f"{md} ± {error}", f"{tex} $\\pm$ {error}"
        elif len(spread) == 2 and not any(pd.isna(v) for v in spread):
            interval = f" [{fmt.format(spread[0])}, {fmt.format(spread[1])}]"
            md, tex = md + interval, tex + interval
        return md, tex

    return render


def _text(value: Any) -> tuple[str, str]:
    text = "-" if value in (None, "") else str(value)
    return text, latex_escape(text)


FORMATS: dict[str, Formatter] = {
    "text": _text,
    "percent": number_format("{:.1f}"),  # fractions are multiplied by 100 before formatting
    "seconds": number_format("{:.3f}"),
    "speedup": number_format("{:.2f}", "×", r"$\times$"),
    "tokens": number_format("{:.1f}"),
    "count": number_format("{:.0f}"),
    "number": number_format("{:.4f}"),
    "delta": number_format("{:+.1f}"),
    "ratio": number_format("{:.2f}"),
    "p": number_format("{:.2g}"),
}


def latex_escape(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                          ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}"),
                          ("Δ", r"$\Delta$"), ("τ", r"$\tau$"), ("×", r"$\times$")):
        text = text.replace(char, escaped)
    return text


@dataclass
class Column:
    name: str
    kind: str = "text"  # a FORMATS key
    group: str | None = None  # the spanning header (a dataset)

    @property
    def header(self) -> str:
        return f"{self.group} {self.name}" if self.group else self.name


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def cells(self, index: int) -> list[list[str]]:
        """Formatted cells: index 0 for Markdown, 1 for LaTeX."""
        return [[FORMATS[c.kind](v)[index] for c, v in zip(self.columns, row)] for row in self.rows]

    def to_markdown(self) -> str:
        header = [c.header for c in self.columns]
        align = ["---" if c.kind == "text" else "---:" for c in self.columns]
        lines = [f"**{self.title}**", "", _md_row(header), _md_row(align)]
        lines += [_md_row(row) for row in self.cells(0)]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        spec = "".join("l" if c.kind == "text" else "r" for c in self.columns)
        lines = [r"\begin{table}[t]", r"\centering", f"\\caption{{{latex_escape(self.title)}}}",
                 f"\\begin{{tabular}}{{{spec}}}", r"\toprule"]
        if any(c.group for c in self.columns):
            heads, rules, start = [], [], 0
            for group, members in itertools.groupby(self.columns, key=lambda c: c.group):  # spanning headers
                width = len(list(members))
                if group:
                    heads.append(f"\\multicolumn{{{width}}}{{c}}{{{latex_escape(group)}}}")
                    rules.append(f"\\cmidrule(lr){{{start + 1}-{start + width}}}")
                else:
                    heads += [""] * width
                start += width
            lines += [" & ".join(heads) + r" \\", " ".join(rules)]
        lines += [" & ".join(latex_escape(c.name) for c in self.columns) + r" \\", r"\midrule"]
        lines += [" & ".join(row) + r" \\" for row in self.cells(1)]
        lines += [r"\bottomrule", r"\end{tabular}"]
        if self.note:
            lines.append(f"\\par\\smallskip{{\\footnotesize {latex_escape(self.note)}}}")
        lines.append(r"\end{table}")
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        import html

        head = "".join(f"<th>{html.escape(c.header)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in self.cells(0))
        note = f"<p class='note'>{html.escape(self.note)}</p>" if self.note else ""
        return f"<h4>{html.escape(self.title)}</h4><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _row_key(run: pd.Series) -> tuple:
    """Tables list the baselines first (LLM-only, SLM-only), then methods by name, knobs in ascending order."""
    params = tuple(sorted((k, (0, v) if isinstance(v, (int, float)) else (1, str(v))) for k, v in run["params"].items()))
    return method_rank(run["method"]), params


def _tables_per_pair_budget(runs: pd.DataFrame, build: Callable[[str, int, pd.DataFrame, list[str]], Table]) -> list[Table]:
    runs = runs.assign(dataset_label=dataset_labels(runs))
    return [build(pair, budget, block, sorted(set(block["dataset_label"]))) for (pair, budget), block in runs.groupby(["pair", "budget"])]


def _method_rows(block: pd.DataFrame) -> list[tuple[tuple[str, str], dict[str, pd.Series]]]:
    """(method, setting) in table order, with that configuration's run per dataset label."""
    ordered = sorted((r for _, r in block.iterrows()), key=_row_key)
    rows: dict[tuple[str, str], dict[str, pd.Series]] = {}
    for run in ordered:
        rows.setdefault((run["method"], run["setting"]), {})[run["dataset_label"]] = run
    return list(rows.items())


def _value(run: pd.Series | None, column: str, scale: float = 1.0) -> float | None:
    """`column` of `run` times `scale`; None where the run, the column or its value is missing."""
    value = None if run is None else run.get(column)
    return None if value is None or pd.isna(value) else float(value) * scale


def _with_se(run: pd.Series | None, column: str, scale: float = 1.0) -> tuple[float | None, float | None]:
    """(value, standard error): rendered `value ± se` where the runs frame has `<column>_se`."""
    return _value(run, column, scale), _value(run, f"{column}_se", scale)


def _with_ci(run: pd.Series | None, column: str, interval: str, scale: float = 1.0) -> tuple[float | None, ...]:
    """(value, low, high): rendered `value [low, high]` where the runs frame has the interval."""
    return _value(run, column, scale), _value(run, f"{interval}_low", scale), _value(run, f"{interval}_high", scale)


def _per_dataset_tables(runs: pd.DataFrame, title: str, note: str, columns: list[tuple[str, str]],
                        cells: Callable[[pd.DataFrame, pd.Series | None], list[Any]]) -> list[Table]:
    """Per pair and budget, `columns` (name, kind) under each dataset, filled by `cells(block, run or None)`."""
    def build(pair: str, budget: int, block: pd.DataFrame, datasets: list[str]) -> Table:
        table = Table(f"{title}: {pair}, budget {budget} tokens",
                      [Column("Method"), Column("Setting"), *(Column(name, kind, d) for d in datasets for name, kind in columns)], note=note)
        table.rows = [[method, setting, *(cell for d in datasets for cell in cells(block, by_dataset.get(d)))]
                      for (method, setting), by_dataset in _method_rows(block)]
        return table

    return _tables_per_pair_budget(runs, build)


def _baseline_value(block: pd.DataFrame, run: pd.Series, column: str) -> float | None:
    """`column` of the LLM-only run of `run`'s comparison."""
    base = block[(block["comparison"] == run["comparison"]) & (block["method"] == BASELINE)]
    return None if base.empty or pd.isna(base[column].iloc[0]) else float(base[column].iloc[0])


def accuracy_latency_tables(runs: pd.DataFrame, latency: str = "latency_s") -> list[Table]:
    """R-Stitch Table 1: per dataset, accuracy (%), mean latency (s) and speedup over LLM-only."""
    def cells(block: pd.DataFrame, run: pd.Series | None) -> list[Any]:
        speedup = None if run is None or pd.isna(run[latency]) else _speedup(block, run, latency)
        spread = _with_ci(run, "speedup", "speedup_ci")[1:] if latency == "latency_s" else ()
        return [_with_se(run, "accuracy", 100), _with_ci(run, latency, "latency_ci"), (speedup, *spread)]

    note = f"Lat: mean {latency} per problem; Spd: Lat({BASELINE}) / Lat at the same comparison key. {INTERVAL_NOTE}"
    columns = [("Acc (%)", "percent"), ("Lat (s)", "seconds"), ("Spd", "speedup")]
    return _per_dataset_tables(runs, "Accuracy, latency and speedup", note, columns, cells)


def _speedup(block: pd.DataFrame, run: pd.Series, latency: str) -> float | None:
    if latency == "latency_s":
        return _value(run, "speedup")
    base = _baseline_value(block, run, latency)
    return None if base is None else base / float(run[latency])


def token_tables(runs: pd.DataFrame) -> list[Table]:
    """R-Stitch's token tables: mean output tokens of the LLM, the SLM, their total and its reduction against LLM-only (%)."""
    def cells(block: pd.DataFrame, run: pd.Series | None) -> list[Any]:
        base = None if run is None else _baseline_value(block, run, "tokens")
        reduction = None if run is None or base is None or run["tokens"] is None else 100 * (1 - run["tokens"] / base)
        return [_value(run, "tokens_llm"), _value(run, "tokens_slm"), _value(run, "tokens"), (reduction, *_reduction_interval(run))]

    note = f"Red.: 1 - total / total of {BASELINE} at the same comparison key, with its 95% paired bootstrap interval over problems."
    columns = [("LLM tok", "tokens"), ("SLM tok", "tokens"), ("Total", "tokens"), ("Red. (%)", "percent")]
    return _per_dataset_tables(runs, "Output tokens per problem", note, columns, cells)


def _reduction_interval(run: pd.Series | None) -> tuple[float, ...]:
    """R-Stitch's token reduction (%) = 100 (1 - token ratio): the token ratio's interval, flipped."""
    _, low, high = _with_ci(run, "token_ratio", "token_ratio_ci")
    return () if low is None or high is None else (100 * (1 - high), 100 * (1 - low))


def benchmark_accuracy_tables(runs: pd.DataFrame) -> list[Table]:
    """RSD Table 2: accuracy (%) per benchmark, their average (rows with every benchmark) and its difference to
    the target-only row (percentage points)."""
    def build(pair: str, budget: int, block: pd.DataFrame, datasets: list[str]) -> Table:
        columns = [Column("Method"), Column("Setting")] + [Column(d, "percent") for d in datasets]
        columns += [Column("Avg.", "percent"), Column(f"Δ vs {BASELINE}", "delta")]
        table = Table(f"Accuracy (%) per benchmark: {pair}, budget {budget} tokens", columns,
                      note="Avg. only over rows with every benchmark; Δ in percentage points.")
        for (method, setting), by_dataset in _method_rows(block):
            accuracies = [_value(by_dataset.get(d), "accuracy", 100) for d in datasets]
            known = [a for a in accuracies if a is not None]
            average = sum(known) / len(known) if len(known) == len(accuracies) else None
            table.rows.append([method, setting, *accuracies, average, None])  # Δ filled below
        target = next((row[-2] for row in table.rows if row[0] == BASELINE), None)
        for row in table.rows:
            row[-1] = None if row[-2] is None or target is None else row[-2] - target
        return table

    return _tables_per_pair_budget(runs, build)


def runs_table(runs: pd.DataFrame, latency: str = "latency_s") -> Table:
    """Every run: accuracy and latency with their uncertainty, the paired comparison with the baseline, acceptance,
    LLM token share, and the frontier flag with its bootstrap share."""
    columns = [Column("Group"), Column("Method"), Column("Setting"), Column("Acc (%)", "percent"),
               Column(f"ΔAcc vs {BASELINE} (pp)", "delta"), Column("p", "p"), Column("Lat (s)", "seconds"),
               Column("Est spd", "speedup"), Column("CPU spd", "speedup"), Column("Spd", "speedup"), Column("Tok ratio", "ratio"),
               Column("Per-tok spd", "speedup"), Column("Tokens", "tokens"), Column("LLM share (%)", "percent"), Column("Acceptance (%)", "percent"),
               Column("Frontier")]
    table = Table("Runs", columns, note=f"Lat: mean {latency} per problem. Acceptance: drafted steps kept (step-level "
                                        "methods), draft tokens kept (speculative), else the SLM's token share. "
                                        "Est spd: the speedup in the latency model's estimate (the forwards each decode "
                                        "ran, each at its cost in the latency model of latency_dir), which other "
                                        "jobs on the cores do not move, led with for that reason (a CPU's figure); CPU spd: "
                                        "in the decodes' CPU time (CPU runs); Spd: in wall clock, the papers' figure and "
                                        "a GPU's. "
                                        f"Spd = Per-tok spd / Tok ratio. {INTERVAL_NOTE}")
    for _, run in runs.iterrows():
        table.rows.append([run["group"], run["method"], run["setting"], _with_se(run, "accuracy", 100),
                           _with_se(run, "accuracy_diff", 100), _value(run, "accuracy_diff_p"), _with_ci(run, latency, "latency_ci"),
                           _value(run, "speedup_estimate"), _value(run, "speedup_cpu"),
                           _with_ci(run, "speedup", "speedup_ci"), _with_ci(run, "token_ratio", "token_ratio_ci"),
                           _with_ci(run, "per_token_latency_ratio", "per_token_latency_ratio_ci"), _value(run, "tokens"),
                           _value(run, "llm_token_share", 100), _value(run, "acceptance", 100), frontier_label(run)])
    return table


INTERVAL_NOTE = (f"± one standard error (accuracy: clustered by problem; ΔAcc: paired with {BASELINE} on the same "
                 "problems, p from McNemar's exact test); [ ] a 95% interval (latency, speedup and its split: "
                 "bootstrap over problems, paired with the baseline). See docs/analysis.md.")


def frontier_label(run: pd.Series) -> str:
    """`yes` on the frontier, with the share of bootstrap resamples it is on it in (`yes (83%)`; off it, the share if > 0)."""
    share = run.get("frontier_share")
    known = share is not None and not pd.isna(share)
    if run.get("on_frontier"):
        return f"yes ({100 * share:.0f}%)" if known else "yes"
    return f"({100 * share:.0f}%)" if known and share > 0 else ""


def matched_speedup_table(summary: pd.DataFrame) -> Table:
    columns = [Column("Group"), Column("Method"), Column("Baseline"), Column("Top matched acc (%)", "percent"),
               Column("Spd at top", "speedup"), Column("Max spd", "speedup"), Column("at acc (%)", "percent")]
    rows = [[r["group"], r["method"], r["baseline"], 100 * r["top_accuracy"], r["speedup_at_top"], r["max_speedup"],
             100 * r["max_speedup_accuracy"]] for _, r in summary.iterrows()]
    return Table("Speedup at matched accuracy", columns, rows,
                 note="Latency each method needs to reach an accuracy both reach (measured runs, no interpolation).")


def replace_marked_section(path: str | os.PathLike, name: str, text: str) -> None:
    """Put `text` between `<!-- name:begin -->` and `<!-- name:end -->` of a hand-written doc (appended if missing)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    doc = Path(path)
    current = doc.read_text()
    head, rest = current.split(begin, 1) if begin in current else (current.rstrip() + "\n\n", end)
    doc.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[-1])
