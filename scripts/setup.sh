#!/usr/bin/env bash
# Sets up .venv on a fresh machine: the CPU torch build first (so no CUDA wheel is pulled), then the package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[test]"
# tests/deploy/test_dashboard.py runs a real Prometheus and skips without one: Debian's package, where apt can
# install it (as root); a machine without it still sets up.
if ! command -v prometheus >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }; } \
    || echo "setup.sh: could not install prometheus with apt; tests/deploy/test_dashboard.py will skip" >&2
fi
