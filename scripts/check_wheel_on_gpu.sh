#!/usr/bin/env bash
# On a GPU machine with a CUDA torch and nvcc: builds the wheel, installs it alone into a clean directory
# (torch and the rest from the machine), hides nvcc, then runs the GPU tests against the installed wheel,
# renders one job of the toy checkpoint through `farm submit` (and checks its sidecar says the kernels were
# prebuilt), and times the ops load (benchmarks/bench_ops_load.py, beside the JIT build from this checkout and
# concurrent first loads). DEPS: extra PYTHONPATH for packages the machine lacks (Ray, structlog, ...); LOGS:
# where logs go (default /tmp); REPEATS: processes per timed case (default 3); DIST: a folder holding a wheel
# built before by scripts/build_wheel.sh (then none is built).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${LOGS:-/tmp}
work=$(mktemp -d)
status=0

if [ -n "${DIST:-}" ]; then
  mkdir -p "$work/dist" && cp "$DIST"/cosmos3_farm-*.whl "$work/dist/" || exit 1
else
  start=$(date +%s)
  # The shipping targets, not the machine's TORCH_CUDA_ARCH_LIST (the H200 image sets "9.0a"); ARCHS overrides.
  TORCH_CUDA_ARCH_LIST=${ARCHS:-"9.0;10.0+PTX"} PYTHON="$PY" bash scripts/build_wheel.sh "$work/dist" \
    > "$LOGS/wheel_build.log" 2>&1 || { tail -40 "$LOGS/wheel_build.log"; exit 1; }
  echo "wheel built in $(( $(date +%s) - start )) s: $(ls "$work"/dist)"
fi
"$PY" -m pip install -q --no-deps --no-index --target "$work/site" "$work"/dist/*.whl || exit 1
ls "$work/site/cosmos3/ops" | grep -E "_cuda_ops" ; cat "$work/site/cosmos3/ops/_cuda_ops_build.json"
cuobjdump --list-elf --list-ptx "$work"/site/cosmos3/ops/_cuda_ops*.so 2>&1 | head -20

# The GPU tests against the installed wheel: tests (and the benchmarks' input builders some of them use) copied
# out of the checkout, nvcc hidden.
cp -r tests benchmarks pyproject.toml "$work/"
nocuda_path=$(echo "$PATH" | tr : '\n' | while read -r d; do [ -x "$d/nvcc" ] || echo "$d"; done | paste -sd:)
(cd "$work" && env -u CUDA_HOME -u CUDA_PATH PATH="$nocuda_path" PYTHONPATH="$work/site${DEPS:+:$DEPS}" \
   "$PY" -c "import shutil, cosmos3.ops as o; print('cosmos3 from', o.__file__, '| nvcc:', shutil.which('nvcc'))" &&
 cd "$work" && env -u CUDA_HOME -u CUDA_PATH PATH="$nocuda_path" PYTHONPATH="$work/site${DEPS:+:$DEPS}" \
   "$PY" -m pytest -m gpu tests/cosmos3 -q -p no:cacheprovider > "$LOGS/gpu_tests.log" 2>&1) || status=1
tail -5 "$LOGS/gpu_tests.log"

# One job of the toy checkpoint through the farm (an embedded Ray cluster, one GPU worker), nvcc still hidden.
cp -r checkpoints "$work/"
cat > "$work/one-job.yaml" <<'YAML'
version: 1
name: wheel-check
model: {checkpoint: checkpoints/toy/fp8}
output: {root: renders, path: "{task}/{id}"}
jobs:
  - {id: red-circle, task: t2i, prompt: "a red circle", size: [96, 96], steps: 20, guidance: 4.0}
YAML
(cd "$work" && env -u CUDA_HOME -u CUDA_PATH PATH="$nocuda_path" PYTHONPATH="$work/site${DEPS:+:$DEPS}" \
   "$PY" -m farm submit one-job.yaml --no-progress > "$LOGS/farm_submit.log" 2>&1) || status=1
tail -5 "$LOGS/farm_submit.log"
"$PY" - "$work/renders/t2i/red-circle.png.json" <<'PYEOF' || status=1
import json, sys
ops = json.load(open(sys.argv[1]))["worker"].get("ops")
print("farm submit: sidecar worker.ops", ops)
sys.exit(0 if ops and ops["source"] == "prebuilt" else 1)
PYEOF

PYTHONPATH="$PWD${DEPS:+:$DEPS}" "$PY" -m benchmarks.bench_ops_load --prebuilt "$work/site" --source . \
  ${DEPS:+--deps "$DEPS"} --concurrent 4 --repeats "${REPEATS:-3}" 2>&1 | tee "$LOGS/bench_ops_load.log" || status=1
exit "$status"
