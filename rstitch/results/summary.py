"""summary.json of a run and its console table (`rstitch-run`, `rstitch-merge`)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstitch.grading.version import GRADER_VERSION
from rstitch.results.baseline import missing_speedup_reason
from rstitch.results.keys import RunIdentity, identify
from rstitch.results.metrics import COMPARISON_KEYS, compare_with_baseline, self_comparison, summarize_samples

if TYPE_CHECKING:  # results are read without the methods (and their engines) loaded
    from rstitch.methods import Method


def summarize_run(cfg: dict[str, Any], method: Method, samples: list[dict[str, Any]], results_root: str | Path,
                  identity: RunIdentity | None = None) -> dict[str, Any]:
    """summary.json of a run (or merged shards), compared with the LLM-only run under `results_root`."""
    identity = identity or identify(cfg, results_root)
    common = {
        "method": method.name,
        "pair": cfg["pair"]["name"],
        "dataset": cfg["dataset"]["name"],
        "run_tag": identity.run_tag,  # names the run directory
        "setting_tag": identity.setting_tag,  # what the console shows: the settings that differ from the method's defaults
        **summarize_samples(samples),
        "batch_size": cfg.get("batch_size", 1),
        "latency_estimated": any(s.get("latency_estimated") for s in samples),
        "comparison_key": identity.comparison_key,
        "config": cfg,
        **dict.fromkeys(COMPARISON_KEYS),
        "grader_version": GRADER_VERSION,  # rstitch-regrade grades a run of an older grader again
    }
    own = method.summarize(samples)
    clash = sorted(set(own) & set(common))
    if clash:  # a method's key must not silently replace a common metric
        raise ValueError(f"method '{method.name}' summarizes keys of the common summary: {', '.join(clash)}")
    summary = {**common, **own}
    summary.update(self_comparison(summary) if method.baseline == "target" else compare_with_baseline(summary, samples, results_root))
    summary["speedup_missing"] = missing_speedup_reason(summary, results_root)
    return summary


def cell(key: str, fmt: str, extra: str = "") -> Callable[[dict[str, Any]], str | None]:
    """A summary's `key` as `fmt`, beside its standard error (`extra="se"`: `value +/- se`) or its 95% interval
    (`"ci"`: `value [low, high]`) where the summary has it; None where the key is missing."""
    def render(s: dict[str, Any]) -> str | None:
        if s.get(key) is None:
            return None
        found = s.get(f"{key}_{extra}") if extra else None
        if extra == "se":
            return fmt.format(s[key]) + ("" if found is None else " +/- " + fmt.format(found).lstrip("+"))
        return fmt.format(s[key]) + ("" if not found else f" [{fmt.format(found[0])}, {fmt.format(found[1])}]")

    return render


# (header, cell of a summary; None shows "-"). The speedups lead with the one other jobs on the cores move
# least (docs/analysis.md, "Timings on a shared machine"; SPEEDUP_LEGEND under the table).
TABLE_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str | None]], ...] = (
    ("method", cell("method", "{}")), ("tag", lambda s: s.get("setting_tag") or s.get("run_tag")),  # an older summary has no setting_tag
    ("n", cell("n_samples", "{}")),
    ("accuracy +/- se", cell("accuracy", "{:.3f}", "se")), ("acc_diff +/- se", cell("accuracy_diff", "{:+.3f}", "se")),
    ("p", cell("accuracy_diff_p", "{:.2g}")), ("latency_s", cell("latency_s", "{:.3f}")),
    ("tokens", cell("tokens", "{:.1f}")), ("slm_tok", cell("tokens_slm", "{:.1f}")),
    ("llm_tok", cell("tokens_llm", "{:.1f}")), ("switches", cell("switches", "{:.1f}")),
    ("est_speedup [95% CI]", cell("speedup_estimate", "{:.2f}", "ci")),
    ("cpu_speedup [95% CI]", cell("speedup_cpu", "{:.2f}", "ci")), ("wall_speedup [95% CI]", cell("speedup", "{:.2f}", "ci")),
    ("tok_ratio", cell("token_ratio", "{:.2f}")),
    ("reduction_%", lambda s: None if s.get("token_reduction") is None else f"{100 * s['token_reduction']:.1f}"),  # R-Stitch's token reduction
    ("per_tok_x", cell("per_token_latency_ratio", "{:.2f}")), ("tok/s_speedup", cell("speedup_tokens_per_s", "{:.2f}")),
)


def format_table(*summaries: dict[str, Any]) -> str:
    """One row per run summary (TABLE_COLUMNS), right-aligned; a missing value is "-"."""
    rows = [[render(s) or "-" for _, render in TABLE_COLUMNS] for s in summaries]
    headers = [header for header, _ in TABLE_COLUMNS]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [headers, *rows])


SPEEDUP_LEGEND = ("est_speedup: the forwards each decode ran, each at its cost in the latency model (latency_dir, "
                  "scripts/profile_latency.py), so other jobs on the cores do not move it: the figure on a CPU; "
                  "cpu_speedup: in the decodes' CPU time; wall_speedup: in wall clock, the papers' figure and a GPU's")


def speedup_legend(*summaries: dict[str, Any]) -> list[str]:
    """The legend under the console table, where a run has an estimated speedup."""
    return [SPEEDUP_LEGEND] if any(s.get("speedup_estimate") is not None for s in summaries) else []
