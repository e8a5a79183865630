#!/usr/bin/env bash
# RSD: LLM-only, SLM-only; then the acceptance threshold delta.
#   experiments/rsd.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
for grid in "" _delta _baselines; do
  rstitch-run -m experiment=rsd_$setting$grid "$@"
done
