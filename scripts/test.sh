#!/usr/bin/env bash
# Sets everything up from a fresh machine and runs the whole test suite (GPU tests skip without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if command -v nvcc >/dev/null; then
  bash scripts/compile_csrc.sh   # compile-only check of every kernel for the wheel's targets (sm_90, sm_100, PTX)
fi
.venv/bin/python -m pytest "$@"
