#!/usr/bin/env bash
# RSD: LLM-only, SLM-only; SD with 7 speculative tokens; the acceptance threshold delta; maj@N and
# Best-of-N (N = 16); process Best-of-N and beam search (Table 3); RSD with four PRMs (Table 5). paper adds the 72B setting (N = 64), which has no testbed twin.
#   experiments/rsd.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
grids=("" _sd _delta _baselines _pbon _beam _prms)
if [[ $setting == paper ]]; then grids+=(_72b _72b_sd _72b_delta _72b_baselines); fi
for grid in "${grids[@]}"; do
  rstitch-run -m experiment=rsd_$setting$grid "$@"
done
