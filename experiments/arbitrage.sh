#!/usr/bin/env bash
# Arbitrage: LLM-only, SLM-only; the router threshold tau (paper: pass method.router.path=...), RSD's
# delta and the oracle's tau on the same grid (Figure 4). paper adds Figure 5(a): the router and RSD
# on Q4-8B/8B, MATH500 (Figure 5(b), 1B/8B on OlympiadBench, is part of the Figure 4 grids).
#   experiments/arbitrage.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
grids=("" _tau _rsd _oracle)
for grid in "${grids[@]}"; do
  rstitch-run -m experiment=arbitrage_$setting$grid "$@"
done
if [[ $setting == paper ]]; then  # Figure 5(a): Q4-8B/8B on MATH500, its baselines first
  for grid in _latency _latency_tau _latency_rsd; do
    rstitch-run -m experiment=arbitrage_paper$grid "$@"
  done
fi
