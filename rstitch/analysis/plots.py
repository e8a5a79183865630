"""The papers' figures from our runs, as matplotlib Figures: no pyplot state, so they render the same in
scripts, reports and notebooks."""
from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap, to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from rstitch.analysis.collect import BASELINE, OUTCOMES
from rstitch.analysis.frontier import check_latency_column, mark_frontier
from rstitch.methods import METHODS, method_class, method_rank

LATENCY_LABELS = {
    "latency_s": "mean latency per problem (s, wall clock)",
    "latency_median_s": "median latency per problem (s, wall clock)",
    "latency_estimate_s": "mean latency per problem (s, latency model)",
}
OUTCOME_COLORS = dict(zip(OUTCOMES.values(), ("#2ca02c", "#1f77b4", "#d62728", "#9e9e9e")))
RANDOM = "random"


# tab10 without its grey, then eight CSS colours each as far (CIE76, lightness 25-75) from those before
# it as any could be: every two methods at least as far apart as tab10's closest two (tab20's light
# shades put rsd beside llm_only). tab10 is a ListedColormap of RGB triples; the stubs say otherwise.
_TAB10 = cast(tuple[tuple[float, float, float], ...], cast(ListedColormap, colormaps["tab10"]).colors)
PALETTE = tuple(to_hex(c) for i, c in enumerate(_TAB10) if i != 7) + (
    "#0000ff", "#ff00ff", "#556b2f", "#ffa07a", "#a9a9a9", "#ff1493", "#9932cc", "#2f4f4f")
MARKERS = "osD^vP*XphH<>d8"


def method_style(method: str) -> tuple[str, str]:
    """The (colour, marker) of `method` by its place among all registered methods: the same in every figure."""
    index = sorted(METHODS, key=method_rank).index(method_class(method).name)
    return PALETTE[index % len(PALETTE)], MARKERS[index % len(MARKERS)]


def _marker_kwargs(color: str, marker: str, size: float = 7.0) -> dict:
    """Hollow markers: two methods' coinciding points stay visible."""
    return {"marker": marker, "color": color, "ms": size, "mfc": "none", "mew": 1.6}


def _by_method(points: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return sorted(points.groupby("method"), key=lambda item: method_rank(item[0]))


def _legend_right(ax: Axes, *args: Any) -> None:
    ax.legend(*args, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


def _figure(width: float = 7.0, height: float = 4.2) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def png_bytes(fig: Figure, dpi: int = 130) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


MIN_ACCURACY_SPAN = 10.0  # percentage points the accuracy axis shows at least


def _accuracy_axis(ax, points: pd.DataFrame, group: str) -> None:
    """Fitted to the accuracies and interval ends, a tenth of their span (at least MIN_ACCURACY_SPAN) as margin; title, legend."""
    ax.set_ylabel("accuracy (%)")
    ends = [c for c in ("accuracy", "accuracy_ci_low", "accuracy_ci_high") if c in points]
    known = points[ends].stack().dropna() * 100
    low, high = (float(known.min()), float(known.max())) if len(known) else (0.0, 100.0)
    if high - low < MIN_ACCURACY_SPAN:
        middle = min(max((low + high) / 2, MIN_ACCURACY_SPAN / 2), 100 - MIN_ACCURACY_SPAN / 2)
        low, high = middle - MIN_ACCURACY_SPAN / 2, middle + MIN_ACCURACY_SPAN / 2
    margin = (high - low) / 10
    ax.set_ylim(max(-3.0, low - margin), min(103.0, high + margin))
    ax.grid(alpha=0.3)
    ax.set_title(group, fontsize=10)
    _legend_right(ax)


def accuracy_latency_figure(runs: pd.DataFrame, group: str, latency: str = "latency_s") -> Figure:
    """One group: a line per method through its runs, random routing as crosses, the frontier ringed."""
    points = runs[runs["group"] == group]
    if "on_frontier" not in points:
        points = mark_frontier(points, latency)
    check_latency_column(points, latency)
    fig, ax = _figure()
    for method, mine in _by_method(points):
        mine = mine.sort_values(latency)
        if method == RANDOM:
            ax.scatter(mine[latency], mine["accuracy"] * 100, marker="x", s=40, color="grey", label="random routing", zorder=3)
        else:
            ax.plot(mine[latency], mine["accuracy"] * 100, ls="-" if len(mine) > 1 else "", label=method, alpha=0.85,
                    zorder=3, **_marker_kwargs(*method_style(method)))
        _error_bars(ax, mine, latency, "grey" if method == RANDOM else method_style(method)[0], x_interval="latency")
    front = points[points["on_frontier"]].sort_values(latency)
    ax.step(front[latency], front["accuracy"] * 100, "k--", where="post", lw=1, alpha=0.6, zorder=2)
    ax.scatter(front[latency], front["accuracy"] * 100, s=160, facecolors="none", edgecolors="black", lw=1.2,
               label="Pareto frontier (% of resamples on it)" if "frontier_share" in points else "Pareto frontier", zorder=4)
    labels = []
    for _, run in points.iterrows():
        label = _frontier_annotation(run)
        if label:
            labels.append(ax.annotate(label, (run[latency], run["accuracy"] * 100), textcoords="offset points",
                                      xytext=(6, 6), fontsize=7, color="black" if run["on_frontier"] else "dimgrey"))
    positive = points[latency][points[latency] > 0]
    if len(positive) and positive.max() / positive.min() > 20:  # SLM-only and LLM-only can be 10x apart
        ax.set_xscale("log")
    ax.set_xlabel(LATENCY_LABELS[latency])
    _accuracy_axis(ax, points, group)
    separate_labels(fig, labels)
    return fig


def separate_labels(fig: Figure, labels: list[Annotation], gap_px: float = 2.0) -> None:
    """Move labels up, lowest first, until none overlaps one placed before it (on the rendered figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # the layout, which moves the axes, comes first
    placed: list[Bbox] = []
    for label in sorted(labels, key=lambda a: a.get_window_extent(renderer).y0):
        for _ in range(len(labels)):
            box = label.get_window_extent(renderer)
            clash = [p for p in placed if box.overlaps(p)]
            if not clash:
                break
            dx, dy = label.xyann
            label.xyann = (dx, dy + (max(p.y1 for p in clash) - box.y0 + gap_px) * 72 / fig.dpi)
        placed.append(label.get_window_extent(renderer))


def _extents(runs: pd.DataFrame, value: str, interval: str, scale: float = 1.0) -> list[pd.Series]:
    """Distances from `value` to `<interval>_ci_low` and `_ci_high`, as errorbar takes them."""
    point = runs[value] * scale
    return [(point - runs[f"{interval}_ci_low"] * scale).clip(lower=0), (runs[f"{interval}_ci_high"] * scale - point).clip(lower=0)]


def _error_bars(ax, runs: pd.DataFrame, x: str, color: str, x_interval: str | None = None, x_scale: float = 1.0) -> None:
    """95% intervals of accuracy and, with `x_interval`, of x (`<x_interval>_ci_low/high`), of the runs that have them."""
    columns = ["accuracy_ci_low", "accuracy_ci_high"] + ([f"{x_interval}_ci_low", f"{x_interval}_ci_high"] if x_interval else [])
    if not all(c in runs for c in columns):
        return
    known = runs.dropna(subset=columns)
    if known.empty:
        return
    xerr = _extents(known, x, x_interval, x_scale) if x_interval else None
    ax.errorbar(known[x] * x_scale, known["accuracy"] * 100, xerr=xerr, yerr=_extents(known, "accuracy", "accuracy", 100),
                fmt="none", ecolor=color, elinewidth=1.3, capsize=3, alpha=0.9, zorder=2)


def _frontier_annotation(run: pd.Series) -> str:
    """Frontier points: their setting and their frontier share (if known); other points that share if >= 20%."""
    share = run.get("frontier_share")
    known = share is not None and not pd.isna(share)
    if run["on_frontier"]:
        return " ".join(filter(None, [str(run["setting"] or ""), f"{100 * share:.0f}%" if known else ""]))
    return f"{100 * share:.0f}%" if known and share >= 0.2 else ""


def accuracy_acceptance_figure(runs: pd.DataFrame, group: str) -> Figure:
    """Accuracy vs acceptance (the legend says what each method counts), one line per method; the acceptance
    rate is a pooled count, so only accuracy has an interval."""
    points = runs[(runs["group"] == group) & runs["acceptance"].notna()]
    fig, ax = _figure()
    for method, mine in _by_method(points):
        mine = mine.sort_values("acceptance")
        ax.plot(mine["acceptance"] * 100, mine["accuracy"] * 100, ls="-" if len(mine) > 1 else "",
                label=f"{method} ({mine['acceptance_kind'].iloc[0]})", alpha=0.85, zorder=3, **_marker_kwargs(*method_style(method)))
        _error_bars(ax, mine, "acceptance", method_style(method)[0], x_scale=100)
    ax.set_xlabel("acceptance rate (%): small-model proposals kept")
    ax.set_xlim(-3, 103)
    _accuracy_axis(ax, points, group)
    return fig


# In the order the console table leads with them (results/summary.py): what other jobs move least first.
SPEEDUP_LABELS = {"speedup_estimate": "latency model's estimate", "speedup_cpu": "CPU time of the decodes",
                  "speedup": "wall clock"}


def leading_speedup(runs: pd.DataFrame) -> str:
    """The first of SPEEDUP_LABELS the runs have, as the console table leads."""
    return next((k for k in SPEEDUP_LABELS if k in runs and runs[k].notna().any()), "speedup")


def speedup_figure(runs: pd.DataFrame, group: str) -> Figure:
    """Each hybrid run's leading speedup with its 95% interval (the wall-clock one a grey cross when another
    leads); a run measured under contention is labelled so."""
    points = runs[(runs["group"] == group) & (runs["method"] != BASELINE)]
    points = points.assign(_rank=points["method"].map(method_rank)).sort_values(["_rank", "setting"])
    lead = leading_speedup(points)
    points = points[points[lead].notna()]  # runs without a baseline have no speedup
    fig, ax = _figure(7.0, 1.2 + 0.45 * max(len(points), 1))
    y = np.arange(len(points))[::-1]
    for position, (_, run) in zip(y, points.iterrows()):
        color, marker = method_style(run["method"])
        ax.plot([run[lead]], [position], ls="", zorder=3, **_marker_kwargs(color, marker))
        low, high = run.get(f"{lead}_ci_low"), run.get(f"{lead}_ci_high")
        if pd.notna(low) and pd.notna(high):
            ax.errorbar([run[lead]], [position], xerr=[[max(run[lead] - low, 0)], [max(high - run[lead], 0)]], fmt="none",
                        ecolor=color, elinewidth=1.3, capsize=3, zorder=2)
        if lead != "speedup" and not pd.isna(run["speedup"]):
            ax.plot([run["speedup"]], [position], ls="", marker="x", color="grey", ms=6, zorder=2)
        if isinstance(run.get("contention"), str):
            ax.annotate("contended", (run[lead], position), textcoords="offset points", xytext=(8, 4), fontsize=7, color="#d62728")
    ax.axvline(1.0, color="black", lw=0.8, ls=":")
    ax.set_yticks(y, [f"{r.method} {r.setting}".strip() for r in points.itertuples()], fontsize=8)
    ax.set_ylim(-0.7, len(points) - 0.3)
    ax.set_xlabel(f"speedup over {BASELINE} (×), {SPEEDUP_LABELS[lead]}, with its 95% interval")
    if lead != "speedup":
        _legend_right(ax, [Line2D([], [], ls="", marker="x", color="grey")], ["wall-clock speedup"])
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(group, fontsize=10)
    return fig


def sample_speedup_figure(paired: pd.DataFrame, title: str) -> Figure:
    """One run's problems (`paired_with_baseline`) by speedup, coloured by who was correct; token reduction right."""
    ordered = paired.sort_values("speedup", ascending=False).reset_index(drop=True)
    fig, ax = _figure(7.5, 4.4)
    x = np.arange(len(ordered))
    ax.bar(x, ordered["speedup"], color=[OUTCOME_COLORS[o] for o in ordered["outcome"]], width=0.8)
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xlabel("problem (sorted by speedup)")
    ax.set_ylabel(f"speedup over {BASELINE} (×)")
    ax.set_xlim(-0.7, len(ordered) - 0.3)
    if len(ordered) > 40:
        ax.set_xticks([])
    else:
        ax.set_xticks(x, [str(i + 1) for i in x], fontsize=7)
    right = ax.twinx()
    right.plot(x, ordered["token_reduction"] * 100, "k.-", lw=1, ms=5)
    right.set_ylabel(f"token reduction vs {BASELINE} (%)")
    handles: list[Artist] = [Patch(color=c, label=o) for o, c in OUTCOME_COLORS.items() if o in set(ordered["outcome"])]
    handles.append(Line2D([], [], color="black", marker=".", label="token reduction"))
    ax.set_title(title, fontsize=10)
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig


OUTCOME_SHADES = (("correct", True, "#2ca02c"), ("incorrect", False, "#d62728"))


def _violin(ax, values: list[np.ndarray], labels: list[str], colors: list[str]) -> None:
    """Violins where a density exists (two distinct values or more), the points always."""
    rng = np.random.default_rng(0)
    for position, (data, color) in enumerate(zip(values, colors), start=1):
        if len(data) > 1 and np.ptp(data) > 0:
            body = ax.violinplot([data], positions=[position], showmeans=True, widths=0.7)
            for part in body["bodies"]:
                part.set_facecolor(color)
                part.set_alpha(0.35)
            for key in ("cbars", "cmins", "cmaxes", "cmeans"):
                body[key].set_color(color)
        jitter = rng.uniform(-0.08, 0.08, size=len(data))
        ax.scatter(position + jitter, data, s=10, color="black", alpha=0.6, zorder=3)
    ax.set_xticks(range(1, len(values) + 1), labels)
    ax.set_xlim(0.4, len(values) + 0.6)


def entropy_figure(tokens: pd.DataFrame, title: str, thresholds: Iterable[float] = ()) -> Figure:
    """From `traces.token_scores`: mean entropy per trace by outcome (left), token entropies by trace outcome with
    the R-Stitch thresholds dotted (right)."""
    from rstitch.analysis.traces import trace_entropy

    traces = trace_entropy(tokens)
    fig = Figure(figsize=(9, 4), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.6])
    values = [traces.loc[traces["correct"] == flag, "mean_entropy"].to_numpy() for _, flag, _ in OUTCOME_SHADES]
    _violin(left, values, [f"{name}\n(n={len(v)} traces)" for (name, _, _), v in zip(OUTCOME_SHADES, values)],
            [color for _, _, color in OUTCOME_SHADES])
    left.set_ylabel("mean normalized entropy per trace (H / log V)")
    left.grid(alpha=0.3, axis="y")
    bins = np.linspace(0.0, max(float(tokens["normalized_entropy"].max()), 1e-3), 41)
    for name, flag, color in OUTCOME_SHADES:
        data = tokens.loc[tokens["correct"] == flag, "normalized_entropy"]
        right.hist(data, bins=bins, histtype="stepfilled", alpha=0.3, color=color)
        right.hist(data, bins=bins, histtype="step", lw=1.2, color=color, label=f"tokens of {name} traces (n={len(data)})")
    taus = sorted(thresholds)
    for tau in taus:  # one legend entry for them all
        right.axvline(tau, color="black", ls=":", lw=1, label="R-Stitch τ = " + ", ".join(f"{t:g}" for t in taus) if tau == taus[0] else None)
    right.set_yscale("log")
    right.set_xlabel("normalized entropy per token (H / log V)")
    right.set_ylabel("tokens (count, log scale)")
    right.legend(fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def speedup_consistency_figure(points: pd.DataFrame, runs: pd.DataFrame) -> Figure:
    """From `speedup_vs_consistency`: each problem a dot, each run (pooled) a large hollow marker."""
    fig, ax = _figure()
    for method, mine in _by_method(points):  # the runs pool these problems: each method has both
        color, marker = method_style(method)
        ax.scatter(mine["consistency"] * 100, mine["speedup"], s=14, alpha=0.5, color=color, marker=marker)
        pooled = runs[runs["method"] == method]
        ax.scatter(pooled["consistency"] * 100, pooled["speedup"], s=110, facecolors="none", edgecolors=color, marker=marker,
                   linewidths=1.8, label=f"{method} (run)", zorder=3)
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xlabel("token consistency (%): SLM greedy token = LLM token")
    ax.set_ylabel(f"speedup over {BASELINE} (×)")
    ax.set_xlim(-3, 103)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    _legend_right(ax, [*handles, Line2D([], [], ls="", marker="o", ms=4, color="grey", alpha=0.5)], [*labels, "one problem"])
    ax.set_title(", ".join(sorted(set(points["group"]))), fontsize=10)
    return fig
