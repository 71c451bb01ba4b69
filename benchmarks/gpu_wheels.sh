#!/usr/bin/env bash
# Wheels for a GPU machine without a package index (Python 3.12, x86-64): what benchmarks/gpu.sh and the test
# suite need beyond a CUDA PyTorch image with transformers and accelerate: datasets, trl and their pure-Python
# needs, gguf, and the transformers a fresh install gets (the image holds 5.17). datasets needs pyarrow >= 24:
# the image held 25.0.1 on 2026-11-26; --pyarrow adds one (55 MB) for an image with an older one. Writes them into .whl/ (git-ignored), ~16 MB.
#   bash benchmarks/gpu_wheels.sh [--pyarrow]
# There:  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-dir)/info/exclude"; mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
wanted=(transformers==5.24.0 datasets==5.2.0 trl==1.16.0 gguf==0.19.0 "dill<0.4.2" "multiprocess<0.70.20" math-verify==0.9.0 latex2sympy2_extended "antlr4-python3-runtime==4.13.2")
[ "${1:-}" = "--pyarrow" ] && wanted+=("pyarrow>=24")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${wanted[@]}"
ls -la .whl
