#!/usr/bin/env bash
# Everything a short GPU lease should run, in one call, within a deadline: the test suite on CUDA, then the GPU
# benchmark one objective at a time (rollout, dpo, grpo, kto; one pass each), stopping before the deadline.
# Logs go to $OUT (the device tool's output folder) or benchmarks/results/.
#   Here:   bash benchmarks/gpu_wheels.sh            (wheels the device image lacks, into .whl/)
#   There:  bash benchmarks/gpu_session.sh [SECONDS]  (default 520), with .whl carried
# Measured on one H200 (2026-11-26): install 15 s, tests 222 s (-n 8), rollout 99 s, dpo 150 s, grpo 157 s.
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
END=$((SECONDS + ${1:-520}))
LOGS=${OUT:-benchmarks/results}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | grep -v WARNING | tail -3
  export PYTHONPATH=$PWD/src:/tmp/site
fi
python3 -c "import sys, torch, transformers, datasets, trl, accelerate; print(sys.version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'trl', \
trl.__version__, torch.cuda.get_device_name(0))"
T0=$SECONDS
OMP_NUM_THREADS=2 HUMANLINE_TEST_DEVICE=cuda timeout 230 bash scripts/test.sh -n 8 --maxfail=1000 -rfE \
  --durations=15 > "$LOGS/gpu_tests.log" 2>&1
echo "TESTS rc=$? in $((SECONDS - T0)) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/gpu_tests.log" | tail -40
for part in rollout dpo grpo kto; do
  left=$((END - SECONDS)); [ $left -lt 40 ] && { echo "SKIP $part ($left s left)"; continue; }
  T0=$SECONDS
  timeout $left bash benchmarks/gpu.sh python3 --only $part --repeats 1 2>&1 | tee -a "$LOGS/gpu_bench.log" \
    | grep -v "^{" | tail -14
  echo "BENCH $part rc=$? in $((SECONDS - T0)) s"
done
