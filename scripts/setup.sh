#!/usr/bin/env bash
# Create a virtual environment (default .venv) and install humanline with its dev extras.
# The CPU build of torch is installed first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
venv="${1:-.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "torch==2.13.0"
"$venv/bin/pip" install -q -e ".[dev]"
