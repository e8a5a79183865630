"""Error bars: the estimators against closed forms (binomial standard error, Wilson interval,
paired differences, McNemar's exact test), clustering by problem, seeded bootstrap intervals,
the speedup split in summaries, and the power helper."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from rstitch.analysis.power import detectable_difference, discordant_share, problems_needed
from rstitch.errors import ConfigError
from rstitch.results.summary import summarize_run
from rstitch.results.uncertainty import (
    accuracy_estimate,
    clustered_se,
    mcnemar_exact_p,
    paired_accuracy_difference,
    problem_means,
    speedup_intervals,
    wilson_interval,
)


def test_one_sample_per_problem_gives_the_binomial_standard_error_and_wilson_interval():
    correct = [1.0] * 9 + [0.0] * 11
    estimate = accuracy_estimate(correct, [f"p{i}" for i in range(20)])
    assert estimate.accuracy == 0.45 and estimate.se == pytest.approx(math.sqrt(0.45 * 0.55 / 20))
    wilson = stats.binomtest(9, 20).proportion_ci(0.95, method="wilson")
    assert (estimate.low, estimate.high) == pytest.approx((wilson.low, wilson.high))
    assert estimate.effective_n == pytest.approx(20)


def test_an_interval_at_zero_or_one_is_not_empty():
    none_right = accuracy_estimate([0.0] * 10, list(range(10)))
    assert none_right.se == 0 and none_right.low == 0 and none_right.high == pytest.approx(wilson_interval(0.0, 10)[1])
    assert none_right.high > 0.2  # about 3/n, where p +/- z se would claim [0, 0]
    assert accuracy_estimate([1.0], ["only"]).se is None  # one problem: no standard error


def test_clustering_widens_the_interval_when_the_samples_of_a_problem_agree():
    # 10 problems x 4 samples; every sample of a problem agrees: the information is 10 problems, not 40 samples.
    problems = [f"p{i}" for i in range(10) for _ in range(4)]
    agreeing = [1.0 if i < 5 else 0.0 for i in range(10) for _ in range(4)]
    clustered = accuracy_estimate(agreeing, problems)
    as_if_independent = accuracy_estimate(agreeing, list(range(40)))
    assert clustered.se == pytest.approx(math.sqrt(0.25 / 10)) and as_if_independent.se == pytest.approx(math.sqrt(0.25 / 40))
    assert clustered.se == pytest.approx(2 * as_if_independent.se)  # sqrt(k) for perfect agreement
    assert clustered.effective_n == pytest.approx(10)
    assert clustered.high - clustered.low > as_if_independent.high - as_if_independent.low
    assert (clustered.low, clustered.high) == pytest.approx(wilson_interval(0.5, 10))
    # Samples that disagree within a problem as much as across problems: clustering changes little.
    mixed = [float(j % 2) for i in range(10) for j in range(4)]
    assert clustered_se(mixed, problems) < as_if_independent.se


def test_paired_difference_is_exact_when_the_runs_agree_and_closed_form_otherwise():
    ids = [f"p{i}" for i in range(20)]
    baseline = problem_means([1.0 if i < 10 else 0.0 for i in range(20)], ids)
    same = paired_accuracy_difference(baseline, baseline)
    assert (same.difference, same.se, same.p_value, same.test) == (0.0, 0.0, 1.0, "mcnemar_exact")
    # The method also solves p10 and p11: +0.1 exactly, on the same problems.
    better = problem_means([1.0 if i < 12 else 0.0 for i in range(20)], ids)
    diff = paired_accuracy_difference(better, baseline)
    assert diff.difference == pytest.approx(0.1) and diff.n_problems == 20
    assert diff.se == pytest.approx(math.sqrt(2 - 2**2 / 20) / 20)  # sqrt((b + c) - (b - c)^2 / n) / n
    assert diff.p_value == pytest.approx(stats.binomtest(2, 2).pvalue) == pytest.approx(0.5)
    unpaired = math.hypot(accuracy_estimate(better.means, ids).se, accuracy_estimate(baseline.means, ids).se)
    assert diff.se < unpaired / 2  # pairing removes the problems both get right or both get wrong


def test_paired_difference_uses_the_shared_problems_and_clusters_samples():
    run = problem_means([1, 1, 0, 0, 1, 1], ["a", "a", "b", "b", "c", "c"])
    baseline = problem_means([1, 0, 0, 0], ["a", "a", "b", "b"])  # no c: compared on a and b only
    diff = paired_accuracy_difference(run, baseline)
    assert diff.n_problems == 2 and diff.difference == pytest.approx(0.25) and diff.test == "z_clustered"
    assert diff.se == pytest.approx(math.sqrt(2 * 0.25**2) / 2)


@pytest.mark.parametrize("b, c", [(0, 0), (3, 0), (5, 2), (2, 9), (20, 11)])
def test_mcnemar_exact_matches_scipy(b, c):
    assert mcnemar_exact_p(b, c) == pytest.approx(1.0 if b + c == 0 else stats.binomtest(b, b + c).pvalue)


def _timings(seed: int, n: int = 30):
    rng = np.random.default_rng(seed)
    ids = [f"p{i}" for i in range(n)]
    base_tokens = rng.integers(100, 400, n).astype(float)
    run_tokens = base_tokens * rng.uniform(0.3, 0.8, n)
    latency = {"baseline": problem_means(base_tokens * 0.02, ids), "run": problem_means(run_tokens * 0.015, ids)}
    return latency, {"baseline": problem_means(base_tokens, ids), "run": problem_means(run_tokens, ids)}


def test_bootstrap_intervals_are_seeded_and_contain_the_estimates():
    latency, tokens = _timings(1)
    first, again = speedup_intervals(latency, tokens), speedup_intervals(latency, tokens)
    assert first == again and first != speedup_intervals(latency, tokens, seed=1)
    speedup = latency["baseline"].means.mean() / latency["run"].means.mean()
    ratio = tokens["run"].means.mean() / tokens["baseline"].means.mean()
    assert first.speedup[0] < speedup < first.speedup[1] and first.token_ratio[0] < ratio < first.token_ratio[1]
    # Every token costs 0.015 s against 0.02 s: the per-token ratio is exact, so its interval is a point.
    assert first.per_token_latency_ratio == pytest.approx((0.02 / 0.015, 0.02 / 0.015))


def test_an_exact_speedup_has_a_point_interval():
    ids = [f"p{i}" for i in range(8)]
    base = problem_means([1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0], ids)
    half = problem_means(base.means / 2, ids)
    intervals = speedup_intervals({"run": half, "baseline": base}, {"run": half, "baseline": base})
    assert intervals.speedup == pytest.approx((2.0, 2.0)) and intervals.token_ratio == pytest.approx((0.5, 0.5))
    assert intervals.per_token_latency_ratio == pytest.approx((1.0, 1.0)) and intervals.n_problems == 8


# --------------------------------------------------------------------------- summaries


def _config(method: str) -> dict:
    return {"pair": {"name": "p"}, "engine": {"name": "hf"}, "dataset": {"name": "d", "limit": 12}, "prompt": {"name": "chat"},
            "max_new_tokens": 64, "decoding": {"temperature": 0.0}, "n_samples": 1, "method": {"name": method}}


def _sample(i: int, correct: bool, latency: float, tokens: int) -> dict:
    cost = {m: {"forward_time_s": 0.1, "forward_calls": 3} for m in ("slm", "llm")}
    return {"id": f"p{i}", "sample_index": 0, "correct": correct, "latency_s": latency, "tokens": tokens, "tokens_slm": tokens,
            "tokens_llm": 0, "discarded_tokens": 0, "switches": 0, "cost": cost, "flops": 1.0}


def _method(name: str, baseline: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, baseline=baseline, summarize=lambda samples: {})


def _write_run(root, name: str, summary: dict, samples: list[dict]) -> None:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def test_summary_carries_intervals_the_paired_difference_and_the_speedup_split(tmp_path):
    base_samples = [_sample(i, i < 6, 1.0 + 0.1 * i, 100 + 10 * i) for i in range(12)]
    base = summarize_run(_config("llm_only"), _method("llm_only", "target"), base_samples, tmp_path)
    assert base["speedup"] == base["token_ratio"] == base["per_token_latency_ratio"] == 1.0 and base["accuracy_diff"] == 0.0
    _write_run(tmp_path, "llm_only", base, base_samples)
    samples = [_sample(i, i < 5, 0.4 + 0.05 * (i % 3), 40 + 3 * i) for i in range(12)]
    summary = summarize_run(_config("rstitch"), _method("rstitch"), samples, tmp_path)
    assert summary["speedup"] == pytest.approx(base["latency_s"] / summary["latency_s"])  # its meaning is unchanged
    assert summary["token_ratio"] == pytest.approx(summary["tokens"] / base["tokens"])
    assert summary["token_reduction"] == pytest.approx(1 - summary["token_ratio"])
    # The split: speedup = (1 / token ratio) x per-token latency ratio.
    assert summary["speedup"] == pytest.approx(summary["per_token_latency_ratio"] / summary["token_ratio"])
    assert summary["per_token_latency_ratio"] == pytest.approx((base["latency_s"] / base["tokens"]) / (summary["latency_s"] / summary["tokens"]))
    for key in ("speedup", "token_ratio", "per_token_latency_ratio", "accuracy"):
        low, high = summary[f"{key}_ci"]
        assert low <= summary[key] <= high, key
    assert summary["accuracy_se"] == pytest.approx(math.sqrt(5 / 12 * 7 / 12 / 12))
    assert summary["accuracy_diff"] == pytest.approx(-1 / 12) and summary["accuracy_diff_test"] == "mcnemar_exact"
    assert summary["accuracy_diff_se"] == pytest.approx(math.sqrt(1 - 1 / 12) / 12) and summary["accuracy_diff_p"] == 1.0
    assert summary["paired_problems"] == 12
    assert summarize_run(_config("rstitch"), _method("rstitch"), samples, tmp_path) == summary  # seeded: the same again
    json.dumps(summary, allow_nan=False)  # standard JSON: a missing value is null, never NaN


def test_without_a_baseline_the_comparison_is_empty_but_accuracy_has_its_error(tmp_path):
    samples = [_sample(i, i % 2 == 0, 1.0, 10) for i in range(6)]
    summary = summarize_run(_config("rstitch"), _method("rstitch"), samples, tmp_path)
    assert summary["speedup"] is None and summary["speedup_ci"] is None and summary["accuracy_diff"] is None
    assert summary["token_ratio"] is None and summary["accuracy_se"] == pytest.approx(math.sqrt(0.25 / 6))
    assert summary["latency_ci"] == [1.0, 1.0]


# --------------------------------------------------------------------------- power


def test_problems_needed_closed_forms():
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert problems_needed(0.5, 0.45) == math.ceil(z**2 * (0.25 + 0.45 * 0.55) / 0.05**2) == 1562
    # Paired (Connor 1987): with 10% of problems discordant far fewer are needed.
    paired = (stats.norm.ppf(0.975) * math.sqrt(0.1) + stats.norm.ppf(0.8) * math.sqrt(0.1 - 0.05**2)) ** 2 / 0.05**2
    assert problems_needed(0.5, 0.45, discordant=0.1) == math.ceil(paired) == 312
    assert problems_needed(0.5, 0.45, difference=0.1) < problems_needed(0.5, 0.45)
    n = problems_needed(0.6, 0.5)
    assert detectable_difference(n, 0.6, 0.5) <= 0.1 < detectable_difference(n - 1, 0.6, 0.5)
    assert detectable_difference(30, 0.5, 0.5) == pytest.approx(z * math.sqrt(0.5 / 30))
    with pytest.raises(ConfigError, match="difference of 0"):
        problems_needed(0.5, 0.5)
    with pytest.raises(ConfigError, match="discordant"):
        problems_needed(0.5, 0.4, discordant=0.05)


def test_problems_needed_reaches_its_power_in_simulation():
    """Paired runs whose discordant problems split 2:1 (difference 0.05 at 15% discordant): at the
    helper's n, McNemar's exact test (a little conservative) rejects at about the intended rate."""
    import pandas as pd

    n = problems_needed(0.55, 0.5, discordant=0.15)
    rng = np.random.default_rng(0)
    outcome = rng.choice(4, size=(400, n), p=[0.10, 0.05, 0.45, 0.40])  # only run, only baseline, both, neither right
    rejected = [mcnemar_exact_p(int((row == 0).sum()), int((row == 1).sum())) < 0.05 for row in outcome]
    assert 0.7 < np.mean(rejected) < 0.9
    paired = pd.DataFrame({"correct": [True, False, True, False], "baseline_correct": [True, True, False, False]})
    assert discordant_share(paired) == 0.5


def test_wandb_summary_flattens_intervals():
    from rstitch.logging import wandb_summary

    logged = wandb_summary({"accuracy": 0.5, "accuracy_se": 0.1, "accuracy_ci": [0.3, 0.7], "speedup_ci": None, "method": "m"})
    assert logged == {"accuracy": 0.5, "accuracy_se": 0.1, "accuracy_ci_low": 0.3, "accuracy_ci_high": 0.7}
