#!/usr/bin/env bash
# The GPU benchmarks in one command: ours vs TRL (DPO, KTO, GRPO steps; checkpointing off and on; peak memory;
# MFU) and rollout tokens/s, on a 0.5 B-class model in bf16, each measurement in its own process.
#   bash benchmarks/gpu.sh [python] [extra args for benchmarks/gpu.py, e.g. --only dpo,rollout --repeats 1]
# Needs torch with CUDA, transformers, accelerate, datasets and trl (pip install -e '.[bench]'). Writes
# benchmarks/results/gpu.json and a log next to it.
set -euo pipefail
PY=${1:-python}; shift || true
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD/src"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: use benchmarks/gpu.py --small to check the harness'"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" benchmarks/gpu.py "$@" 2>&1 | tee benchmarks/results/gpu.log
