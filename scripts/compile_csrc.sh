#!/usr/bin/env bash
# Compile-only check of every csrc/*.cu for sm_90 (H200) and sm_100 (B200), so a kernel that does not
# build cannot land. The .cu files are torch-free, so plain nvcc works; the defines are the ones
# torch.utils.cpp_extension passes, so code that needs them fails here too. Objects go to a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
ARCHS=(90 100)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

flags=(-std=c++17 -O3 --Werror all-warnings --expt-relaxed-constexpr
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
       -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__)

# One nvcc per (file, arch), all at once: each compiles its device code on one core.
pids=()
names=()
for src in csrc/*.cu; do
  for arch in "${ARCHS[@]}"; do
    "$NVCC" "${flags[@]}" -gencode="arch=compute_${arch},code=sm_${arch}" -c "$src" \
      -o "$out/$(basename "$src" .cu).sm_${arch}.o" &
    pids+=($!)
    names+=("sm_${arch} $src")
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
