"""Cost models beyond what the engine counts: the per-forward latency model (`model.LatencyModel`)."""
