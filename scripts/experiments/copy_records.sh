#!/usr/bin/env bash
# Copy the records of finished `humanline reproduce` runs into lab/records/<name>/ (lab/README.md says what a record
# holds): each run's summary.json and final_eval.json as <run>.summary.json / <run>.final_eval.json, and the data's
# base_eval.json, base_final_eval.json, offline_quality.json and offline.json. Unfinished runs (no summary.json) are
# left out and counted. Existing records are overwritten only by the same file names.
#
#     bash scripts/experiments/copy_records.sh OUTPUT_DIR lab/records/<date>-<task>[-<source>]
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: copy_records.sh OUTPUT_DIR RECORDS_DIR" >&2; exit 2; }
out="$1" dest="$2"
[ -d "$out/runs" ] || { echo "copy_records.sh: $out/runs: no such folder (expected a reproduce --output-dir)" >&2; exit 2; }
mkdir -p "$dest"
for f in base_eval.json base_final_eval.json offline_quality.json offline.json; do
  [ -f "$out/data/$f" ] && cp "$out/data/$f" "$dest/$f"
done
copied=0 skipped=0
for run in "$out"/runs/*/; do
  name="$(basename "$run")"
  if [ -f "$run/summary.json" ]; then
    cp "$run/summary.json" "$dest/$name.summary.json"
    [ -f "$run/final_eval.json" ] && cp "$run/final_eval.json" "$dest/$name.final_eval.json"
    copied=$((copied + 1))
  else
    skipped=$((skipped + 1))
  fi
done
echo "copy_records.sh: $copied finished runs copied to $dest; $skipped unfinished left out"
