"""Cost models beyond what the engine counts: per-forward latency estimates (`model.LatencyModel`),
profiled per runner and fitted by least squares."""
