"""Analysis of the results store: runs and samples as frames, Pareto frontiers, speedup at matched
accuracy, error bars and frontier shares, sample sizes, the papers' tables and figures, and reports
(`rstitch-report`). See docs/analysis.md."""
from rstitch.analysis.collect import (
    find_run_dirs,
    load_runs,
    load_samples,
    load_wandb_runs,
    paired_with_baseline,
    runs_from_wandb,
    unfinished_run_dirs,
)
from rstitch.analysis.frontier import (
    curve_pairs,
    mark_frontier,
    matched_speedup_summary,
    speedup_at_matched_accuracy,
)
from rstitch.analysis.power import detectable_difference, discordant_share, problems_needed
from rstitch.analysis.tables import (
    Table,
    accuracy_latency_tables,
    benchmark_accuracy_tables,
    matched_speedup_table,
    runs_table,
    token_tables,
)
from rstitch.results.uncertainty import frontier_stability, with_intervals

__all__ = [
    "Table", "accuracy_latency_tables", "benchmark_accuracy_tables", "curve_pairs", "detectable_difference",
    "discordant_share", "find_run_dirs", "frontier_stability", "load_runs", "problems_needed", "with_intervals",
    "load_samples", "load_wandb_runs", "mark_frontier", "matched_speedup_summary", "matched_speedup_table",
    "paired_with_baseline", "runs_from_wandb", "runs_table", "speedup_at_matched_accuracy", "token_tables",
    "unfinished_run_dirs",
]
