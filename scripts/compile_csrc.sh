#!/usr/bin/env bash
# Compile-only check of every cosmos3/ops/csrc/*.cu for the targets the wheel is built for (cosmos3/ops/build.py:
# sm_90 for H200, sm_100 for B200, compute_100 PTX; TORCH_CUDA_ARCH_LIST overrides, as for the wheel), so a
# kernel that does not build cannot land. The .cu files are torch-free, so plain nvcc works; the defines are
# the ones torch.utils.cpp_extension passes, so code that needs them fails here too. Objects go to a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
mapfile -t GENCODES < <(python3 cosmos3/ops/build.py)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

flags=(-std=c++17 -O3 --Werror all-warnings --expt-relaxed-constexpr
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
       -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__)

# One nvcc per (file, target), all at once: each compiles its device code on one core.
pids=()
names=()
for src in cosmos3/ops/csrc/*.cu; do
  for gencode in "${GENCODES[@]}"; do
    target=${gencode##*code=}
    "$NVCC" "${flags[@]}" "$gencode" -c "$src" -o "$out/$(basename "$src" .cu).${target}.o" &
    pids+=($!)
    names+=("${target} $src")
  done
done

failed=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "ok      ${names[$i]}"
  else
    echo "FAILED  ${names[$i]}"
    failed=1
  fi
done
exit "$failed"
