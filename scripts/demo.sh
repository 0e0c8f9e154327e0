#!/usr/bin/env bash
# Sets everything up on a fresh machine, then renders manifests/demo.yaml through the farm on CPU workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/farm submit manifests/demo.yaml --workers "${WORKERS:-2}" "$@"
