#!/usr/bin/env bash
# Arbitrage: LLM-only, SLM-only; the router threshold tau (paper: pass method.router.path=...), RSD's
# delta and the oracle's tau on the same grid (Figure 4). paper adds Figure 5's latency pairs.
#   experiments/arbitrage.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
grids=("" _tau _rsd _oracle)
if [[ $setting == paper ]]; then grids+=(_latency); fi
for grid in "${grids[@]}"; do
  rstitch-run -m experiment=arbitrage_$setting$grid "$@"
done
