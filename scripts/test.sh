#!/usr/bin/env bash
# The default test run (CPU, no network): the suite spread over the machine's cores (pytest-xdist; one torch thread
# per worker, tests/conftest.py), then the ten slowest tests. Slow tests: pytest -m slow. One worker:
# HUMANLINE_TEST_WORKERS=0 bash scripts/test.sh
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
python -m pytest -q -x -n "${HUMANLINE_TEST_WORKERS:-auto}" --durations=10 "$@"
