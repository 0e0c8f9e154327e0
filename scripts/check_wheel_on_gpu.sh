#!/usr/bin/env bash
# On a GPU machine with a CUDA torch and nvcc: builds the wheel, installs it alone into a clean directory
# (torch and the rest from the machine), hides nvcc, then times the ops load (benchmarks/bench_ops_load.py,
# beside the JIT build from this checkout and concurrent first loads) and runs the GPU tests against the
# installed wheel. DEPS: extra PYTHONPATH for packages the machine lacks; LOGS: where logs go (default /tmp);
# REPEATS: processes per timed case (default 3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${LOGS:-/tmp}
work=$(mktemp -d)
status=0

start=$(date +%s)
# The shipping targets, not the machine's TORCH_CUDA_ARCH_LIST (the H200 image sets "9.0a"); ARCHS overrides.
TORCH_CUDA_ARCH_LIST=${ARCHS:-"9.0;10.0+PTX"} PYTHON="$PY" bash scripts/build_wheel.sh "$work/dist" \
  > "$LOGS/wheel_build.log" 2>&1 || { tail -40 "$LOGS/wheel_build.log"; exit 1; }
echo "wheel built in $(( $(date +%s) - start )) s: $(ls "$work"/dist)"
"$PY" -m pip install -q --no-deps --no-index --target "$work/site" "$work"/dist/*.whl || exit 1
ls "$work/site/cosmos3" | grep -E "_cuda_ops" ; cat "$work/site/cosmos3/_cuda_ops_build.json"
cuobjdump --list-elf --list-ptx "$work"/site/cosmos3/_cuda_ops*.so 2>&1 | head -20

# The GPU tests against the installed wheel: tests copied out of the checkout, nvcc hidden.
cp -r tests pyproject.toml "$work/"
nocuda_path=$(echo "$PATH" | tr : '\n' | while read -r d; do [ -x "$d/nvcc" ] || echo "$d"; done | paste -sd:)
(cd "$work" && env -u CUDA_HOME -u CUDA_PATH PATH="$nocuda_path" PYTHONPATH="$work/site${DEPS:+:$DEPS}" \
   "$PY" -c "import shutil, cosmos3.ops as o; print('cosmos3 from', o.__file__, '| nvcc:', shutil.which('nvcc'))" &&
 cd "$work" && env -u CUDA_HOME -u CUDA_PATH PATH="$nocuda_path" PYTHONPATH="$work/site${DEPS:+:$DEPS}" \
   "$PY" -m pytest -m gpu tests/cosmos3 -q -p no:cacheprovider > "$LOGS/gpu_tests.log" 2>&1) || status=1
tail -5 "$LOGS/gpu_tests.log"

PYTHONPATH="$PWD${DEPS:+:$DEPS}" "$PY" benchmarks/bench_ops_load.py --prebuilt "$work/site" --source . \
  ${DEPS:+--deps "$DEPS"} --concurrent 4 --repeats "${REPEATS:-3}" 2>&1 | tee "$LOGS/bench_ops_load.log" || status=1
exit "$status"
