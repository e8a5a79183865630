#!/usr/bin/env bash
# EASD vs SpecDec vs RSD: LLM-only, SLM-only; the three methods; the draft's maj@16 and beam search
# (temperature 0.7, top_p 0.8); EASD at the fixed tau_H = 2; the tau_H x tau_O sensitivity grid (Table 6).
#   experiments/easd.sh [paper|testbed] [overrides...]
# paper (default): the paper's setting, on GPUs; testbed: its CPU twin, minutes. The overrides go
# to every grid (a launcher, shards, a narrower grid). Baselines run first; see docs/scale-out.md.
set -euo pipefail
setting=paper
if [[ "${1:-}" == paper || "${1:-}" == testbed ]]; then setting=$1; shift; fi
for grid in "" _compare _baselines _beam _fixed _sensitivity; do
  rstitch-run -m experiment=easd_$setting$grid "$@"
done
