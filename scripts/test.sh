#!/usr/bin/env bash
# The default test run (CPU, no network, a few minutes). Slow tests: pytest -m slow.
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
python -m pytest -q -x "$@"
