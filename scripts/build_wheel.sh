#!/usr/bin/env bash
# Builds the cosmos3-farm wheel with csrc/ compiled in, for the torch of the python that runs it (one wheel per
# torch/CUDA version: the loader refuses a library built for another one). Needs a CUDA build of torch, nvcc
# and ninja; fails instead of making a kernel-less wheel. Targets: TORCH_CUDA_ARCH_LIST, default sm_90 (H200),
# sm_100 (B200) and compute_100 PTX (cosmos3/ops/build.py). Usage: [PYTHON=python3] scripts/build_wheel.sh [dist]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${1:-dist}
# NVIDIA's images often set TORCH_CUDA_ARCH_LIST to their own GPU (the H200 one: "9.0a"): say where it came from.
echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-unset, so the default of cosmos3/ops/build.py}"
COSMOS3_REQUIRE_CUDA_BUILD=1 "$PY" -m pip wheel --no-deps --no-build-isolation -w "$out" .
# What the wheel holds, from its build record (what every node's loader checks).
"$PY" - "$out" <<'PYEOF'
import json, sys, zipfile
from pathlib import Path
wheel = max(Path(sys.argv[1]).glob("cosmos3_farm-*.whl"), key=lambda p: p.stat().st_mtime)
record = json.loads(zipfile.ZipFile(wheel).read("cosmos3/ops/_cuda_ops_build.json"))
abi, archs = record["abi"], record["archs"]
print(f"{wheel}: for torch {abi['torch']} (CUDA {abi['cuda']}, CXX11 ABI {int(abi['cxx11_abi'])}); kernels for "
      + ", ".join([f"sm_{a}" for a in archs["sm"]] + [f"compute_{a} PTX" for a in archs["ptx"]]))
PYEOF
