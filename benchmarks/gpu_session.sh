#!/usr/bin/env bash
# Everything a short GPU lease should run, in one call, within a deadline, most wanted first:
#   1. benchmarks/gpu_profile.py: ours vs TRL, DPO and GRPO steps profiled; sampling vs training tokens/s (<= 460 s)
#   2. the kill -9 resume check on CUDA, with train.deterministic off, then on (about 2 x 40 s)
#   3. the test suite on CUDA, then the gpu.py benchmark one objective at a time, while time is left.
# Logs and results go to $OUT (the device tool's output folder; at most 8 files) or benchmarks/results/.
#   Here:   bash benchmarks/gpu_wheels.sh            (wheels the device image lacks, into .whl/)
#   There:  bash benchmarks/gpu_session.sh [SECONDS]  (default 540), with .whl carried; call with timeout_s 600
# Measured on one H200 (2026-11-26): install 15 s, tests 222 s (-n 8), rollout 99 s, dpo 150 s, grpo 157 s.
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
END=$((SECONDS + ${1:-540}))
LOGS=${OUT:-benchmarks/results}
mkdir -p "$LOGS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | grep -v WARNING | tail -3
  export PYTHONPATH=$PWD/src:/tmp/site
else
  export PYTHONPATH=$PWD/src
fi
python3 -c "import sys, torch, transformers, datasets, trl, accelerate; print(sys.version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'trl', \
trl.__version__, torch.cuda.get_device_name(0))"

# 1. the profile (keeps 90 s for the resume check)
T0=$SECONDS; budget=$(( END - SECONDS - 90 )); [ $budget -gt 460 ] && budget=460
timeout $((budget + 20)) python3 benchmarks/gpu_profile.py --deadline $budget 2>&1 | grep -v "it/s\]" \
  | tee "$LOGS/gpu_profile.log" | grep -v "^{" | tail -40
echo "PROFILE rc=$? in $((SECONDS - T0)) s"
[ "$LOGS" != benchmarks/results ] && cp benchmarks/results/gpu_profile.json "$LOGS/" 2>/dev/null

# 2. kill -9, resume: bit-identical with train.deterministic (the test's default), and without it for comparison
for det in false true; do
  left=$((END - SECONDS)); [ $left -lt 45 ] && { echo "SKIP resume check deterministic=$det ($left s left)"; continue; }
  T0=$SECONDS
  HUMANLINE_TEST_DEVICE=cuda HUMANLINE_TEST_DETERMINISTIC=$det timeout $left python3 -m pytest -q -x \
    tests/reliability/test_crash_resume.py -k sigkill -p no:cacheprovider >> "$LOGS/resume_check.log" 2>&1
  echo "RESUME deterministic=$det rc=$? in $((SECONDS - T0)) s"
done
tail -5 "$LOGS/resume_check.log"

# 3. the suite on CUDA, then the step benchmark, while time is left
left=$((END - SECONDS))
if [ $left -ge 240 ]; then
  T0=$SECONDS
  # SIGINT at the limit: pytest then still prints which tests failed (SIGTERM would kill it before its summary)
  OMP_NUM_THREADS=2 HUMANLINE_TEST_DEVICE=cuda timeout -s INT -k 20 $((left - 30)) bash scripts/test.sh -n 8 \
    --maxfail=1000 -rfE --durations=15 --junitxml="$LOGS/gpu_tests.xml" > "$LOGS/gpu_tests.log" 2>&1
  echo "TESTS rc=$? in $((SECONDS - T0)) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/gpu_tests.log" | tail -40
else
  echo "SKIP tests ($left s left; they need ~230 s)"
fi
for part in dpo grpo; do
  left=$((END - SECONDS)); [ $left -lt 160 ] && { echo "SKIP bench $part ($left s left)"; continue; }
  T0=$SECONDS
  timeout $left bash benchmarks/gpu.sh python3 --only $part --repeats 2 2>&1 | tee -a "$LOGS/gpu_bench.log" \
    | grep -v "^{" | tail -14
  echo "BENCH $part rc=$? in $((SECONDS - T0)) s"
done
