"""Analysis of the results store: frames, frontiers, matched-accuracy speedups, tables, scoring of
stored traces, reports, the CLI and the W&B sweep summary.

Exact numbers come from hand-made runs; the rest runs on a small real sweep of the testbed pair
(`analysis_sweep`, shared with tests/project/test_notebooks.py), whose accuracies are not asserted."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from rstitch.analysis import (
    accuracy_latency_tables,
    benchmark_accuracy_tables,
    load_runs,
    load_samples,
    mark_frontier,
    matched_speedup_summary,
    paired_with_baseline,
    runs_from_wandb,
    runs_table,
    speedup_at_matched_accuracy,
    token_tables,
)
from rstitch.analysis.collect import dataset_labels, run_row, runs_frame
from rstitch.analysis.plots import accuracy_latency_figure, method_style
from rstitch.errors import ConfigError
from rstitch.methods import METHODS

SWEEP_POINTS = [
    ["method=llm_only"], ["method=slm_only"], ["method=rstitch", "method.tau=0.005"], ["method=rstitch", "method.tau=0.05"],
    ["method=random", "method.p=0.5"], ["method=specdec"], ["method=rsd", "method.delta=0.5"],
]
SWEEP_COMMON = ["logger=none", "engine.num_threads=1", "dataset.limit=3", "max_new_tokens=64"]


@pytest.fixture(scope="session")
def analysis_sweep(tmp_path_factory) -> Path:
    """A results root with one run per point of SWEEP_POINTS on 3 testbed problems (resumed, so
    a second request in the session only rewrites the summaries)."""
    from rstitch.cli.run import compose_config
    from rstitch.runner import run_config

    root = tmp_path_factory.getbasetemp() / "analysis_sweep"
    for point in SWEEP_POINTS:
        run_config(compose_config([f"results_root={root}", *SWEEP_COMMON, *point]))
    return root


# --------------------------------------------------------------------------- hand-made runs


def config(method: str, dataset: str = "d1", budget: int = 100, **params) -> dict:
    return {"pair": {"name": "p"}, "engine": {"name": "hf"}, "dataset": {"name": dataset}, "prompt": {"name": "chat"},
            "max_new_tokens": budget, "decoding": {"temperature": 0.0}, "n_samples": 1,
            "method": {"name": method, **params}}


def point(method: str, accuracy: float, latency: float, dataset: str = "d1", budget: int = 100, tokens: float = 100.0,
          share: float = 0.5, **params) -> dict:
    summary = {"accuracy": accuracy, "latency_s": latency, "tokens": tokens, "tokens_llm": tokens * share,
               "tokens_slm": tokens * (1 - share), "llm_token_share": share}
    return run_row(summary, config(method, dataset, budget, **params), run_dir=f"{method}-{params}-{dataset}-{budget}")


CURVES = [
    point("llm_only", 0.9, 4.0, tokens=200.0, share=1.0), point("slm_only", 0.4, 0.5, tokens=80.0, share=0.0),
    point("rstitch", 0.88, 2.0, tau=0.01), point("rstitch", 0.6, 1.0, tau=0.05),
    point("random", 0.7, 3.0, p=0.5), point("random", 0.5, 1.5, p=0.9),
]


def test_frontier_and_speedups_within_one_comparison():
    other_budget = [point("llm_only", 0.95, 8.0, budget=200), point("rstitch", 0.1, 0.1, budget=200, tau=0.05)]
    runs = mark_frontier(runs_frame(CURVES + other_budget))
    frontier = runs[runs["on_frontier"] & (runs["budget"] == 100)]
    assert sorted(frontier["latency_s"]) == [0.5, 1.0, 2.0, 4.0]  # both random points are dominated
    assert runs[runs["budget"] == 200]["on_frontier"].all()  # another budget is another frontier
    speedups = dict(zip(runs["run_dir"], runs["speedup"]))
    assert speedups["rstitch-{'tau': 0.01}-d1-100"] == pytest.approx(2.0)
    assert speedups["rstitch-{'tau': 0.05}-d1-200"] == pytest.approx(80.0)  # against the budget-200 llm_only
    assert set(runs["group"]) == {"p / d1 / budget 100", "p / d1 / budget 200"}


def test_speedup_at_matched_accuracy_uses_the_latency_each_method_needs():
    runs = runs_frame(CURVES)
    curve = speedup_at_matched_accuracy(runs, "rstitch", "random")
    # Levels up to the lower best accuracy (0.7): the cheapest run reaching each one.
    assert list(curve["accuracy"]) == [0.5, 0.6, 0.7]
    assert list(curve["latency"]) == [1.0, 1.0, 2.0]
    assert list(curve["baseline_latency"]) == [1.5, 3.0, 3.0]
    assert list(curve["speedup"]) == pytest.approx([1.5, 3.0, 1.5])
    summary = matched_speedup_summary(runs, [("rstitch", "llm_only")]).iloc[0]
    # Matched up to rstitch's best (0.88 < 0.9), where LLM-only needs its 4 s; at 0.6 rstitch needs 1 s.
    assert summary["top_accuracy"] == 0.88 and summary["speedup_at_top"] == pytest.approx(2.0)
    assert (summary["max_speedup"], summary["max_speedup_accuracy"]) == pytest.approx((4.0, 0.6))
    default = matched_speedup_summary(runs)
    assert {("rstitch", "llm_only"), ("random", "llm_only"), ("rstitch", "random"), ("random", "rstitch")} == set(
        zip(default["method"], default["baseline"]))
    with pytest.raises(ConfigError, match="itself"):
        matched_speedup_summary(runs, [("rstitch", "rstitch")])


def test_paper_tables_layouts():
    second = [point("llm_only", 0.5, 6.0, dataset="d2", tokens=300.0, share=1.0), point("rstitch", 0.6, 3.0, dataset="d2", tau=0.01)]
    runs = runs_frame(CURVES + second)
    [table] = accuracy_latency_tables(runs)
    markdown = table.to_markdown()
    assert "| Method | Setting | d1 Acc (%) | d1 Lat (s) | d1 Spd | d2 Acc (%) | d2 Lat (s) | d2 Spd |" in markdown
    assert "| rstitch | tau=0.01 | 88.0 | 2.000 | 2.00× | 60.0 | 3.000 | 2.00× |" in markdown
    assert "| rstitch | tau=0.05 | 60.0 | 1.000 | 4.00× | - | - | - |" in markdown
    rows = [line.split(" | ")[0] for line in markdown.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["| llm_only", "| slm_only", "| random", "| random", "| rstitch", "| rstitch"]
    latex = table.to_latex()
    assert r"\multicolumn{3}{c}{d1} & \multicolumn{3}{c}{d2}" in latex and r"\cmidrule(lr){3-5}" in latex
    assert r"rstitch & tau=0.01 & 88.0 & 2.000 & 2.00$\times$ & 60.0 & 3.000 & 2.00$\times$ \\" in latex
    assert r"llm\_only" in latex and latex.count(r"\\") == 2 + 6  # two header lines, six method rows

    [bench] = benchmark_accuracy_tables(runs)
    text = bench.to_markdown()
    assert "| llm_only | - | 90.0 | 50.0 | 70.0 | +0.0 |" in text
    assert "| rstitch | tau=0.01 | 88.0 | 60.0 | 74.0 | +4.0 |" in text
    assert "| rstitch | tau=0.05 | 60.0 | - | - | - |" in text  # no average over a missing benchmark
    assert r"$\Delta$ vs llm\_only" in bench.to_latex()

    [tokens] = token_tables(runs)
    assert "| rstitch | tau=0.01 | 50.0 | 50.0 | 100.0 | 50.0 | 50.0 | 50.0 | 100.0 | 66.7 |" in tokens.to_markdown()


def test_settings_show_the_knobs_that_tell_runs_apart():
    rsd = dict(delta=0.7, weighting="binary", seed=0)
    runs = runs_frame([point("rsd", 0.5, 1.0, **rsd), point("rsd", 0.6, 1.2, **{**rsd, "delta": 0.9}),
                       point("rstitch", 0.5, 1.0, tau=0.02), point("specdec", 0.9, 3.0, k=7)])
    assert sorted(runs.loc[runs["method"] == "rsd", "setting"]) == ["delta=0.7", "delta=0.9"]
    assert runs.loc[runs["method"] == "rstitch", "setting"].item() == "tau=0.02"  # the main knob at its default
    assert runs.loc[runs["method"] == "specdec", "setting"].item() == "k=7"  # differs from the default k=5
    # Two configurations that differ only in a nested option stay two rows.
    prm = [run_row({"accuracy": a, "latency_s": 1.0}, {**config("rsd", delta=0.7), "method": {"name": "rsd", "delta": 0.7, "prm": {"name": n}}})
           for a, n in ((0.1, "oracle"), (0.2, "testbed"))]
    labels = runs_frame(prm)["setting"]
    assert labels.nunique() == 2 and all(label.startswith("delta=0.7 [") for label in labels)


def test_groups_are_labelled_by_the_settings_that_differ():
    def run(method: str, limit: int, threads: int, dataset: str = "d1") -> dict:
        cfg = {**config(method, dataset), "dataset": {"name": dataset, "limit": limit},
               "engine": {"name": "hf", "num_threads": threads}}
        return run_row({"accuracy": 0.5, "latency_s": 1.0}, cfg)

    runs = runs_frame([run("llm_only", 20, 1), run("rstitch", 20, 1), run("llm_only", 50, 1), run("llm_only", 50, 2),
                       run("llm_only", 50, 2, dataset="d2")])
    assert sorted(set(runs["group"])) == [
        "p / d1 / budget 100, dataset.limit=20 engine.num_threads=1",
        "p / d1 / budget 100, dataset.limit=50 engine.num_threads=1",
        "p / d1 / budget 100, dataset.limit=50 engine.num_threads=2",
        "p / d2 / budget 100",  # one comparison: nothing to tell apart
    ]
    assert set(dataset_labels(runs)) == {"d1 dataset.limit=20 engine.num_threads=1", "d1 dataset.limit=50 engine.num_threads=1",
                                         "d1 dataset.limit=50 engine.num_threads=2", "d2"}
    prompts = [run_row({"accuracy": 0.5, "latency_s": 1.0}, {**config("llm_only"), "prompt": {"system": text}})
               for text in ("Reason step by step, then box the answer.", "Reason step by step, then box the result.")]
    labels = sorted(runs_frame(prompts)["group"])  # long values by their hash, still apart
    assert labels[0] != labels[1] and all(label.startswith("p / d1 / budget 100, prompt.system=#") for label in labels)


def test_every_method_keeps_its_own_colour_and_marker_in_every_figure():
    styles = {m: method_style(m) for m in METHODS}
    assert len({color for color, _ in styles.values()}) == len(METHODS)  # slm_only and specdec no longer share one
    same_point = [point("llm_only", 0.9, 4.0), point("rstitch_plus", 0.9, 4.0), point("slm_only", 0.4, 0.5)]
    few, more = runs_frame(same_point[:2]), runs_frame(same_point)
    lines = {fig: {line.get_label(): line for line in fig.axes[0].get_lines()}
             for fig in (accuracy_latency_figure(few, few["group"].iloc[0]), accuracy_latency_figure(more, more["group"].iloc[0]))}
    for by_label in lines.values():
        for method in ("llm_only", "rstitch_plus"):
            line = by_label[method]
            assert (line.get_color(), line.get_marker()) == styles[method]
            assert line.get_markerfacecolor() == "none"  # hollow: the coinciding point of the other stays visible
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        method_style("nope")


def cie_lab(color: str) -> tuple[float, float, float]:
    """sRGB to CIE L*a*b* (D65): distances there follow what the eye tells apart."""
    from matplotlib.colors import to_rgb

    linear = [u / 12.92 if u <= 0.04045 else ((u + 0.055) / 1.055) ** 2.4 for u in to_rgb(color)]
    x, y, z = (sum(w * c for w, c in zip(row, linear)) / white for row, white in
               (((0.4124, 0.3576, 0.1805), 0.95047), ((0.2126, 0.7152, 0.0722), 1.0), ((0.0193, 0.1192, 0.9505), 1.08883)))
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_every_two_methods_colours_are_told_apart():
    from itertools import combinations

    colours = {m: method_style(m)[0] for m in METHODS}
    closest = min(math.dist(cie_lab(colours[a]), cie_lab(colours[b])) for a, b in combinations(sorted(colours), 2))
    assert closest >= 25  # tab10's two closest colours are 27.7 apart; tab20's light and dark blue were 20
    assert math.dist(cie_lab(colours["rsd"]), cie_lab(colours["llm_only"])) >= 25


def one_method_sweep() -> pd.DataFrame:
    """A one-method sweep whose accuracies sit between 70% and 80%, two of its points close together."""
    rows = [point("llm_only", 0.78, 0.41, tokens=144.0, share=1.0), point("rstitch", 0.74, 0.5, tau=0.001),
            point("rstitch", 0.72, 0.17, tau=0.01), point("rstitch", 0.74, 0.135, tau=0.02),
            point("rstitch", 0.738, 0.132, tau=0.03)]
    runs = runs_frame(rows)
    for end, shift in (("accuracy_ci_low", -0.04), ("accuracy_ci_high", 0.04)):
        runs[end] = runs["accuracy"] + shift
    runs["latency_ci_low"], runs["latency_ci_high"] = runs["latency_s"] * 0.9, runs["latency_s"] * 1.1
    runs["frontier_share"] = 0.5
    return mark_frontier(runs)


def test_the_accuracy_axis_fits_the_points_and_their_intervals():
    runs = one_method_sweep()
    low, high = accuracy_latency_figure(runs, runs["group"].iloc[0]).axes[0].get_ylim()
    assert 60 <= low <= 68 and 82 <= high <= 90  # the 68-82% the intervals span, a tenth of it as margin; not 0-100


def test_point_labels_do_not_overlap_and_error_bars_are_plain():
    from itertools import combinations

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    runs = one_method_sweep()
    figure = accuracy_latency_figure(runs, runs["group"].iloc[0])
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    labels = [t for t in figure.axes[0].texts if t.get_text()]
    assert len(labels) >= 4
    boxes = [label.get_window_extent(renderer) for label in labels]
    assert not [(a, b) for a, b in combinations(range(len(boxes)), 2) if boxes[a].overlaps(boxes[b])], \
        [label.get_text() for label in labels]
    bars = [c for c in figure.axes[0].collections if c.get_linewidths()[0] > 1.0]
    assert bars and all(c.get_alpha() is None or c.get_alpha() >= 0.8 for c in bars)


def test_runs_of_unknown_methods_are_one_clear_error():
    with pytest.raises(ConfigError, match="unknown method 'retired'; valid: "):
        runs_frame([point("retired", 0.5, 1.0)])


def test_bad_results_directories_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no such results directory"):
        load_runs(tmp_path / "missing")
    with pytest.raises(ConfigError, match="no finished runs"):
        load_runs(tmp_path)
    broken = tmp_path / "run"
    broken.mkdir()
    (broken / "summary.json").write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable summary.json"):
        load_runs(tmp_path)
    shard = config("llm_only")
    shard["dataset"] = {"name": "d1", "shard": 0, "num_shards": 2}
    (broken / "summary.json").write_text(json.dumps({"accuracy": 1.0, "latency_s": 1.0, "config": shard}))
    with pytest.raises(ConfigError, match="rstitch-merge"):
        load_runs(tmp_path)


def hand_made_samples() -> tuple[pd.DataFrame, pd.DataFrame]:
    """20 problems: R-Stitch solves the problems LLM-only solves but one, in half the time with half
    the tokens (per problem, so its speedup, token ratio and per-token ratio are exact); SLM-only
    solves fewer, fastest; random routing is slower than R-Stitch and worse than SLM-only."""
    spec = {  # method, params: (solved problems, latency factor, tokens per problem)
        ("llm_only", ()): (range(14), 1.0, 200), ("rstitch", (("tau", 0.01),)): (range(13), 0.5, 100),
        ("slm_only", ()): (range(6), 0.125, 80), ("random", (("p", 0.5),)): (range(2), 0.75, 150)}
    rows, samples = [], []
    for (method, params), (solved, factor, tokens) in spec.items():
        latencies = [factor * (2.0 + 0.2 * i) for i in range(20)]
        summary = {"accuracy": len(solved) / 20, "latency_s": float(np.mean(latencies)), "tokens": float(tokens),
                   "tokens_llm": float(tokens), "tokens_slm": 0.0, "llm_token_share": 1.0}
        rows.append(run_row(summary, config(method, **dict(params)), run_dir=f"{method}-{dict(params)}"))
        samples += [{"run_dir": f"{method}-{dict(params)}", "id": f"q{i}", "sample_index": 0, "correct": i in solved,
                     "latency_s": latencies[i], "latency_estimate_s": None, "tokens": tokens} for i in range(20)]
    return runs_frame(rows), pd.DataFrame(samples)


def test_intervals_paired_comparisons_and_frontier_shares_of_the_runs():
    from rstitch.results.uncertainty import with_intervals

    runs, samples = hand_made_samples()
    marked = with_intervals(mark_frontier(runs), samples)
    assert marked.equals(with_intervals(mark_frontier(runs), samples))  # seeded
    by = {m: r for m, r in zip(marked["method"], marked.to_dict("records"))}
    assert by["llm_only"]["accuracy_se"] == pytest.approx(math.sqrt(0.7 * 0.3 / 20))
    stitch = by["rstitch"]
    assert stitch["accuracy_diff"] == pytest.approx(-0.05) and stitch["accuracy_diff_p"] == pytest.approx(1.0)
    assert stitch["accuracy_diff_se"] == pytest.approx(math.sqrt(1 - 1 / 20) / 20)
    assert (stitch["speedup"], stitch["speedup_ci_low"], stitch["speedup_ci_high"]) == pytest.approx((2.0, 2.0, 2.0))
    assert (stitch["token_ratio"], stitch["token_ratio_ci_low"], stitch["token_ratio_ci_high"]) == pytest.approx((0.5, 0.5, 0.5))
    assert stitch["per_token_latency_ratio"] == pytest.approx(1.0) and stitch["token_reduction"] == pytest.approx(0.5)
    assert stitch["latency_ci_low"] < stitch["latency_s"] < stitch["latency_ci_high"]
    # Frontier shares: SLM-only (fastest) and R-Stitch always; LLM-only only in the resamples that draw
    # the one problem it alone solves (1 - (19/20)^20 = 64%); random routing never.
    shares = dict(zip(marked["method"], marked["frontier_share"]))
    assert shares["slm_only"] == 1.0 and shares["rstitch"] > 0.99 and shares["random"] == 0.0
    assert shares["llm_only"] == pytest.approx(1 - (19 / 20) ** 20, abs=0.04)

    table = runs_table(marked).to_markdown()
    assert "| llm_only | - | 70.0 ± 10.2 | +0.0 ± 0.0 | 1 |" in table
    assert "| rstitch | tau=0.01 | 65.0 ± 10.7 | -5.0 ± 4.9 | 1 |" in table and "| 2.00× [2.00, 2.00] | 0.50 [0.50, 0.50] |" in table
    assert "yes (100%)" in table and f"yes ({100 * shares['llm_only']:.0f}%)" in table
    [paper] = accuracy_latency_tables(marked)
    assert "65.0 ± 10.7 |" in paper.to_markdown() and r"65.0 $\pm$ 10.7 &" in paper.to_latex()
    [tokens] = token_tables(marked)
    assert "| 50.0 [50.0, 50.0] |" in tokens.to_markdown()
    figure = accuracy_latency_figure(marked, marked["group"].iloc[0])
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert "100%" in texts and "tau=0.01 100%" in texts  # SLM-only has no setting: its share alone
    assert len(figure.axes[0].collections) >= 2 * 4  # error bars on both axes of every point


def test_runs_recorded_intervals_from_summary_json_or_wandb():
    from rstitch.results.uncertainty import recorded_intervals

    assert recorded_intervals({"speedup_ci": [1.5, 2.5], "accuracy_se": 0.1}) == recorded_intervals(
        {"speedup_ci_low": 1.5, "speedup_ci_high": 2.5, "accuracy_se": 0.1})
    assert recorded_intervals({})["speedup_ci_low"] is None


# --------------------------------------------------------------------------- the real sweep


@pytest.mark.slow
def test_runs_and_samples_of_a_sweep(analysis_sweep):
    runs = load_runs(analysis_sweep)
    assert len(runs) == len(SWEEP_POINTS) and runs["comparison"].nunique() == 1
    assert list(runs["method"][:2]) == ["llm_only", "slm_only"]
    llm_latency = runs.loc[runs["method"] == "llm_only", "latency_s"].item()
    assert (runs["speedup"] * runs["latency_s"]).to_numpy() == pytest.approx(llm_latency)
    kinds = dict(zip(runs["method"], runs["acceptance_kind"]))
    assert kinds["rsd"] == "steps" and kinds["specdec"] == "draft tokens" and kinds["rstitch"] == "SLM token share"
    stitch = runs[runs["method"] == "rstitch"]
    assert (stitch["acceptance"] + stitch["llm_token_share"]).to_numpy() == pytest.approx(1.0)
    assert sorted(stitch["setting"]) == ["tau=0.005", "tau=0.05"]
    for run_dir in runs["run_dir"]:  # each summary.json: the speedup split and the paired comparison with llm_only
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        assert summary["speedup"] == pytest.approx(summary["per_token_latency_ratio"] / summary["token_ratio"])
        assert summary["paired_problems"] == 3 and len(summary["speedup_ci"]) == len(summary["accuracy_ci"]) == 2

    samples = load_samples(runs, traces=True)
    assert len(samples) == 3 * len(runs)
    assert all(len(t) == n for t, n in zip(samples["output_token_ids"], samples["tokens"]))
    paired = paired_with_baseline(samples)
    assert len(paired) == 3 * (len(runs) - 1)
    assert (paired["speedup"] * paired["latency_s"]).to_numpy() == pytest.approx(paired["baseline_latency_s"].to_numpy())
    both = paired["correct"] & paired["baseline_correct"]
    assert ((paired["outcome"] == "both correct") == both).all()


@pytest.mark.slow
def test_runs_from_wandb_match_the_results_store(analysis_sweep):
    from rstitch.analysis.collect import read_summary

    on_disk = load_runs(analysis_sweep)
    wandb_runs = []
    for run_dir in on_disk["run_dir"]:
        summary = read_summary(run_dir)
        numeric = {k: v for k, v in summary.items() if isinstance(v, (int, float))}  # what WandbLogger stores
        wandb_runs.append(SimpleNamespace(config=summary["config"], summary=numeric, url=f"https://wandb/{run_dir}"))
    wandb_runs.append(SimpleNamespace(config={"run_dirs": []}, summary={}, url="sweep summary"))  # left out
    from_wandb = runs_from_wandb(wandb_runs)
    columns = ["method", "setting", "comparison", "group", "accuracy", "latency_s", "speedup", "acceptance"]
    pd.testing.assert_frame_equal(from_wandb[columns], on_disk[columns])


@pytest.mark.slow
def test_scores_of_stored_traces_match_decoding(analysis_sweep, testbed_pair):
    from rstitch.analysis.collect import read_summary
    from rstitch.analysis.traces import token_consistency, token_scores
    from rstitch.data import load_dataset_records
    from rstitch.data.prompts import PromptFormat
    from rstitch.methods.spec_stats import greedy_consistency, greedy_entropies

    runs = load_runs(analysis_sweep)
    samples = load_samples(runs)
    slm = runs[runs["method"] == "slm_only"]
    scores = token_scores(slm, "slm")
    assert len(scores) == samples.loc[samples["method"] == "slm_only", "tokens"].sum()
    assert scores["scorer_agrees"].all()  # a greedy trace scored by its own model: its argmax at every step
    assert scores["normalized_entropy"].between(0, 1).all() and (scores["source"] == "SLM").all()

    record = load_dataset_records(**read_summary(slm["run_dir"].item())["config"]["dataset"])[0]
    prompt = PromptFormat().encode(testbed_pair.tokenizer, record.problem)
    eos = set(testbed_pair.slm.eos_token_ids) | set(testbed_pair.llm.eos_token_ids)
    decoded = greedy_entropies(testbed_pair.slm, prompt, 64, eos)
    first = scores[scores["id"] == record.id]
    assert first["entropy"].to_numpy() == pytest.approx(decoded[:len(first)], abs=1e-4)

    consistency = token_consistency(runs)
    matches, positions = greedy_consistency(testbed_pair, prompt, 64)
    row = consistency[consistency["id"] == record.id].iloc[0]
    assert row["positions"] == positions and row["consistency"] == pytest.approx(matches / positions)


@pytest.mark.slow
def test_report_html_markdown_and_latex(analysis_sweep, tmp_path, capsys):
    from rstitch.cli.report import main

    main([str(analysis_sweep), "-o", str(tmp_path / "out" / "report.md"), "--latex", str(tmp_path / "out" / "tables.tex"),
          "--entropy", "--entropy-samples", "2"])
    printed = capsys.readouterr().out
    assert f"{len(SWEEP_POINTS)} runs" in printed
    markdown = (tmp_path / "out" / "report.md").read_text()
    images = [line[line.index("](") + 2:-1] for line in markdown.splitlines() if line.startswith("![")]
    titles = ("accuracy_latency", "accuracy_acceptance", "sample_speedup", "entropy", "speedup_consistency")
    assert all(any(Path(i).name.startswith(t) for i in images) for t in titles)
    for image in images:
        assert (tmp_path / "out" / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for heading in ("## Runs", "**Speedup at matched accuracy**", "**Accuracy, latency and speedup",
                    "**Output tokens per problem", "**Accuracy (%) per benchmark", "**SLM entropy of correct"):
        assert heading in markdown
    latex = (tmp_path / "out" / "tables.tex").read_text()
    assert latex.count(r"\begin{tabular}") == latex.count(r"\end{table}") == markdown.count("\n**")

    main([str(analysis_sweep), "-o", str(tmp_path / "report.html")])
    html = (tmp_path / "report.html").read_text()
    assert html.count("src='data:image/png;base64,") >= 3 and "<table>" in html


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["{missing}"], "no such results directory"),
    (["{sweep}", "-o", "report.pdf"], "must end in .html or .md"),
    (["{empty}"], "no finished runs"),
])
def test_report_cli_errors(analysis_sweep, tmp_path, capsys, argv, message):
    from rstitch.cli.report import main

    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "sweep": analysis_sweep, "empty": tmp_path / "empty"}
    with pytest.raises(SystemExit) as exit_info:
        main([a.format(**paths) for a in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("rstitch-report: error:") and message in err


@pytest.mark.slow
def test_multirun_logs_a_wandb_sweep_summary(tmp_path, tiny_pair, problems_file):
    """A multirun with logger=wandb (offline) ends with one W&B run: every point, the frontier flagged."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "rstitch.cli.run", "-m", f"results_root={root}", "logger=wandb", "engine.num_threads=1",
           f"pair.slm.path={tiny_pair['slm']}", f"pair.llm.path={tiny_pair['llm']}", "pair.name=tiny", "max_new_tokens=8",
           "dataset=math500", f"dataset.path={problems_file}", "dataset.limit=2", "method=llm_only,slm_only"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [table_file] = root.glob("wandb/offline-run-*/files/media/table/sweep/points_*.table.json")
    table = json.loads(table_file.read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert sorted(r["method"] for r in rows) == ["llm_only", "slm_only"]
    assert {"accuracy_ci_low", "accuracy_ci_high", "speedup_ci_low", "token_ratio", "frontier_share"} <= set(table["columns"])
    runs = mark_frontier(load_runs(root))
    expected = dict(zip(runs["method"], runs["on_frontier"]))
    assert {r["method"]: r["on_frontier"] for r in rows} == expected
    assert list(table_file.parents[4].glob("files/media/images/sweep/frontier/*.png"))


def test_scoring_warns_when_the_models_changed_after_the_run(tmp_path):
    from rstitch.analysis.traces import warn_if_models_changed

    run_dir, model_dir = tmp_path / "run", tmp_path / "slm"
    run_dir.mkdir()
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"weights")
    (run_dir / "samples.jsonl").write_text("{}\n")
    os.utime(model_dir / "model.safetensors", (1_000, 1_000))  # the weights predate the run
    pair = {"slm": {"path": str(model_dir)}, "llm": {"path": str(tmp_path / "hub-id-not-a-dir")}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_models_changed(pair, run_dir)
    os.utime(run_dir / "samples.jsonl", (500, 500))  # the run is older than the weights
    with pytest.warns(UserWarning, match="slm changed after"):
        warn_if_models_changed(pair, run_dir)


def test_replace_marked_section_keeps_the_hand_written_text(tmp_path):
    from rstitch.analysis.tables import replace_marked_section

    doc = tmp_path / "doc.md"
    doc.write_text("intro\n")
    replace_marked_section(doc, "results", "table 1")
    assert doc.read_text() == "intro\n\n<!-- results:begin -->\ntable 1\n<!-- results:end -->"
    doc.write_text(doc.read_text() + "\noutro\n")
    replace_marked_section(doc, "results", "table 2")
    assert doc.read_text() == "intro\n\n<!-- results:begin -->\ntable 2\n<!-- results:end -->\noutro\n"


def test_the_runs_table_leads_with_the_estimated_speedup():
    """The runs frame carries the speedup in the latency model's estimate beside the wall-clock and
    CPU-time ones, and the report's runs table shows it first, saying why (what other jobs do not move)."""
    def timed(method: str, latency: float, cpu: float, estimate: float, **params) -> dict:
        row = point(method, 0.8, latency, **params)
        row.update(latency_cpu_s=cpu, latency_estimate_s=estimate)
        return row

    runs = runs_frame([timed("llm_only", 4.0, 3.0, 2.0), timed("rstitch", 2.0, 1.2, 0.8, tau=0.01)])
    stitch = runs[runs["method"] == "rstitch"].iloc[0]
    assert (stitch["speedup_estimate"], stitch["speedup_cpu"], stitch["speedup"]) == pytest.approx((2.5, 2.5, 2.0))
    table = runs_table(runs)
    names = [c.name for c in table.columns]
    assert names.index("Est spd") < names.index("CPU spd") < names.index("Spd")
    assert "Est spd" in table.note and "do not move" in table.note
    assert "| 2.50× | 2.50× | 2.00×" in table.to_markdown()
    from rstitch.logging.sweep import POINT_COLUMNS  # the W&B sweep table's columns, read from this frame

    assert {"speedup_cpu", "speedup_estimate"} <= set(POINT_COLUMNS) & set(runs.columns)
