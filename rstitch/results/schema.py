"""The fields of a run's records, declared once: docs/reference.md's tables are generated from them
(scripts/reference_tables.py) and tests check that every field a run writes is declared here. A
field annotated without a description shares the one of the field above it (one table row)."""
from __future__ import annotations

from typing import Annotated, Any, TypedDict


class SampleRecord(TypedDict, total=False):
    """One line of samples.jsonl: one (problem, sample)."""

    id: Annotated[str, "the problem, which of its `n_samples`, the method"]
    sample_index: int
    method: str
    response: Annotated[str, "decoded text, tokens, writer of each token (0 SLM, 1 LLM)"]
    output_token_ids: list[int]
    token_sources: list[int]
    answer: Annotated[str | None, "extracted answer, graded equivalence, reference"]
    correct: bool
    gold: Any
    grading_error: Annotated[str, "where the grader says more: why it failed, a program's tests, a grid's share of right cells"]
    code: dict[str, Any]
    cell_accuracy: float
    latency_s: Annotated[float, "wall clock of `decode` after warm-up; with `batch_size` > 1 the latency model's estimate"]
    latency_estimated: Annotated[bool, "batched runs: `latency_s` is the estimate plus the sample's own work; its wall clock in the batch"]
    latency_overhead_s: float
    batch_wall_s: float
    latency_estimate_s: Annotated[float | None, "the latency model's sum over the sample's forwards (null without `latency_dir`)"]
    tokens: Annotated[int, "output tokens in total and per model"]
    tokens_slm: int
    tokens_llm: int
    discarded_tokens: Annotated[int, "tokens decoded and thrown away, model switches, why decoding stopped"]
    switches: int
    finish_reason: str
    finished_by_eos: bool
    max_new_tokens: Annotated[int, "the sample's token budget, where `on_overflow=truncate` cut it below the run's"]
    cost: Annotated[dict[str, dict[str, float]], "per model: `prefill_tokens`, `decode_steps`, `forward_calls`, `forward_time_s`"]
    flops: Annotated[float, "2 x parameters x processed tokens of the pair, plus `stats[\"extra_flops\"]` (PRM, routers; judges run on the LLM)"]
    stats: Annotated[dict[str, Any], "method-specific (acceptance, steps, scores, ...)"]
    measurement: Annotated[dict[str, Any], "what the latency was measured under: threads, device, CPUs, load, CPU time (results/measurement.py)"]


class Comparison(TypedDict, total=False):
    """The comparison with the `llm_only` run of the same comparison key (null without one)."""

    speedup: Annotated[float | None, "Lat(`llm_only`) / Lat(method) in wall clock, CPU time, the latency model's estimate; the throughput ratio"]
    speedup_cpu: float | None
    speedup_estimate: float | None
    speedup_tokens_per_s: float | None
    speedup_ci: Annotated[list[float] | None, "their 95% paired bootstrap intervals, [low, high]"]
    speedup_cpu_ci: list[float] | None
    speedup_estimate_ci: list[float] | None
    token_ratio: Annotated[float | None, "the speedup split: speedup = per_token_latency_ratio / token_ratio; reduction = 1 - token_ratio"]
    token_ratio_ci: list[float] | None
    token_reduction: float | None
    per_token_latency_ratio: float | None
    per_token_latency_ratio_ci: list[float] | None
    accuracy_diff: Annotated[float | None, "the paired accuracy difference over the problems both ran, its standard error, p-value, test"]
    accuracy_diff_se: float | None
    accuracy_diff_p: float | None
    accuracy_diff_test: str | None
    paired_problems: int | None


class RunSummary(Comparison, total=False):
    """summary.json, beside the method's own keys (estimators: docs/analysis.md, "Uncertainty")."""

    method: Annotated[str, "what ran; `setting_tag`: the settings apart from the method's defaults; the resolved `config`"]
    pair: str
    dataset: str
    run_tag: str
    setting_tag: str
    comparison_key: str
    config: dict[str, Any]
    n_problems: Annotated[int, "problems and samples summarized"]
    n_samples: int
    accuracy: Annotated[float, "pass@1 averaged over samples; its standard error clustered by problem; its 95% interval"]
    accuracy_se: float | None
    accuracy_ci: list[float] | None
    latency_s: Annotated[float, "mean latency, its 95% interval, the median"]
    latency_ci: list[float] | None
    latency_median_s: float
    latency_estimate_s: Annotated[float | None, "the latency model's mean estimate; mean CPU time (CPU runs); whether `latency_s` is estimated"]
    latency_cpu_s: float | None
    latency_estimated: bool
    tokens: Annotated[float, "means over the samples; the LLM's share of all output tokens"]
    tokens_slm: float
    tokens_llm: float
    llm_token_share: float
    discarded_tokens: float
    switches: float
    finished_by_eos: float
    flops: Annotated[float, "mean FLOPs per sample; output tokens per second of latency"]
    tokens_per_s: float | None
    forward_time_s_slm: Annotated[float, "per model, mean forward time and calls per sample"]
    forward_time_s_llm: float
    forward_calls_slm: float
    forward_calls_llm: float
    grading_errors: Annotated[int, "samples the grader could not grade; samples left out for their prompt's length (`on_overflow`)"]
    skipped_context_overflow: int
    batch_size: Annotated[int, "the batch size; the decode loop's throughput (loading, warm-up and resumed samples excluded)"]
    decode_wall_s: float | None
    decoded_samples: int
    samples_per_s: float | None
    decode_tokens_per_s: float | None
    speedup_missing: Annotated[str | None, "why `speedup` is null: no `llm_only` run, the settings the nearest differs in, or no latency"]
    grader_version: Annotated[int, "`rstitch-regrade` grades a run of an older grader again ([grading.md](grading.md))"]
    measurement: Annotated[dict[str, Any] | None, "the samples' `measurement` aggregated; `contention`: why the latency is not a quiet machine's"]
    contention: str | None
    merged_from: Annotated[list[str], "the shard runs `rstitch-merge` merged ([scale-out.md](scale-out.md))"]
