from rstitch.results.metrics import find_speedup, find_speedups, summarize_samples
from rstitch.results.store import SampleStore, find_summaries
from rstitch.results.table import load_summaries, pareto_front

__all__ = ["SampleStore", "find_speedup", "find_speedups", "find_summaries", "load_summaries", "pareto_front", "summarize_samples"]
