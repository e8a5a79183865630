#!/usr/bin/env bash
# Arbitrage: LLM-only, SLM-only; then the router threshold tau (paper: pass method.router.path=...).
#   experiments/arbitrage.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
for grid in "" _tau; do
  rstitch-run -m experiment=arbitrage_$setting$grid "$@"
done
