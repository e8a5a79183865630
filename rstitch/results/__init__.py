from rstitch.results.metrics import find_speedups, summarize_samples
from rstitch.results.store import SampleStore, run_summaries
from rstitch.results.table import load_summaries, pareto_front

__all__ = ["SampleStore", "find_speedups", "load_summaries", "pareto_front", "run_summaries", "summarize_samples"]
