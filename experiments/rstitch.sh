#!/usr/bin/env bash
# R-Stitch: LLM-only, SLM-only, SpecDec; then the entropy threshold tau; then random routing p; then
# R-Stitch with DEER's early exit over the same taus;
# then R-Stitch+ (a router trained for each pair: conf/experiment/rstitch_paper_plus.yaml).
#   experiments/rstitch.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
for grid in "" _tau _random _deer _plus; do
  rstitch-run -m experiment=rstitch_$setting$grid "$@"
done
