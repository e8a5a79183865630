#!/usr/bin/env bash
# EASD vs SpecDec vs RSD: LLM-only, SLM-only; then the three methods.
#   experiments/easd.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
for grid in "" _compare _fixed; do
  rstitch-run -m experiment=easd_$setting$grid "$@"
done
