#!/usr/bin/env bash
# Fixed-band sweep on the reported seeds 0-2 (each objective's own default band is its ablation row).
# Usage: bash scripts/experiments/band_sweep.sh OUT   (writes OUT/sweep_<objective>/ and their logs)
set -euo pipefail
out=${1:?usage: band_sweep.sh OUT}
declare -A R
R[grpo]="offline+humanline-band-0.5,0.5 offline+humanline-band-0.2,0.2 offline+humanline-band-0.1,0.2 offline+humanline-band-0.05,0.1"
R[dpo]="offline+humanline-band-1.5,1.5 offline+humanline-band-0.5,0.5 offline+humanline-band-0.2,0.2 offline+humanline-band-0.05,0.1"
R[kto]="offline+humanline-band-1.5,1.5 offline+humanline-band-0.5,0.5 offline+humanline-band-0.2,0.2 offline+humanline-band-0.1,0.2"
mkdir -p "$out"
for obj in dpo kto grpo; do
  # shellcheck disable=SC2086  # the regimes are separate arguments
  humanline demo --objective "$obj" --regimes ${R[$obj]} --seeds 3 --output-dir "$out/sweep_$obj" \
    > "$out/sweep_$obj.log" 2>&1
done
