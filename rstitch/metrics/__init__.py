"""Cost models beyond what the engine counts (per-forward latency estimates), and ranking quality."""
from rstitch.metrics.latency_model import (
    Forward,
    ForwardTrace,
    LatencyModel,
    estimate_latency,
    latency_file,
    load_pair_latency,
)
from rstitch.metrics.ranking import average_ranks, roc_auc, roc_auc_interval, spearman

__all__ = ["Forward", "ForwardTrace", "LatencyModel", "estimate_latency", "latency_file", "load_pair_latency", "roc_auc", "roc_auc_interval",
           "average_ranks", "spearman"]
