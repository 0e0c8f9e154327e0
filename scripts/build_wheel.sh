#!/usr/bin/env bash
# Builds the cosmos3-farm wheel with csrc/ compiled in, for the torch of the python that runs it (one wheel per
# torch/CUDA version: the loader refuses a library built for another one). Needs a CUDA build of torch, nvcc
# and ninja; fails instead of making a kernel-less wheel. Targets: TORCH_CUDA_ARCH_LIST, default sm_90 (H200),
# sm_100 (B200) and compute_100 PTX (cosmos3/ops_build.py). Usage: [PYTHON=python3] scripts/build_wheel.sh [dist]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${1:-dist}
COSMOS3_REQUIRE_CUDA_BUILD=1 "$PY" -m pip wheel --no-deps --no-build-isolation -w "$out" .
"$PY" -c 'import torch; print(f"built for torch {torch.__version__} (CUDA {torch.version.cuda})")'
ls -l "$out"/cosmos3_farm-*.whl
