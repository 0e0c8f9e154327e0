#!/usr/bin/env bash
# Cosmos3-Super (static FP8, random weights, the published layouts) on one GPU through `farm submit`: an H200 holds
# every run; an 80 GB H100 holds them too (benchmarks/results/h100-super.md).
#
#   benchmarks/super_one_gpu.sh OUT [STEP ...]      default steps: write clip distilled report (~14 min)
#
# Each step takes under 10 minutes but `uncached` (~11 on an H100); run them in this order on one machine. A step whose
# checkpoint is gone (a fresh machine) writes it first (~3-4 min more). The clip step's sidecars hold each job's
# measured peak memory and the report prints `farm plan`'s estimate of the same manifest beside it; `memory` and
# `nano` add the steps' and the decode's peaks apart, for Super and for Nano.
#   write      the Super checkpoint (~65.7 GB transformer + 2.8 GB VAE) in /dev/shm (the disk is too small) and three
#              more builds hard-linked to its weights: super-t2i, super-t2i-4step, super-i2v-4step (~4 min)
#   memory     the planned GPU memory beside the measured peak: T2V 720p/189 frames and T2I 1024^2, 7 steps each
#              (the policy's W8A16 steps 0-2 and 4-6 around one W8A8 step), cache off (benchmarks/bench_memory.py;
#              ~4 min)
#   clip       farm submit: two T2I 1024^2/50-step stills, then the T2V 720p/189-frame/35-step clip with the default
#              step cache; worker start with the page cache warm (tmpfs), read rate (bench_read and the worker's
#              own), host peak RSS (~8 min). The host's 64 GiB disk cannot hold the checkpoint: there is no cold read
#              from a local disk to report
#   distilled  farm submit on the 4-step builds: T2I 1024^2 and I2V 720p/189 frames (~3 min)
#   t2i        farm submit on the Super-Text2Image build (no step policy): two T2I 1024^2/50-step stills (~1 min)
#   nano       the Nano checkpoint (16.5 GB) in /dev/shm/nano and the same memory measurement on it (~4 min)
#   rerender   two stills and a short clip (33 frames, 10 steps), default step cache, then three times more with
#              --force, a fresh worker each: byte-identical media (~4 min)
#   uncached   the clip without the step cache (~11 min on an H100, worker start included: 535 s render start to
#              published, h100-super.md)
#   report     the tables (benchmarks.bench_render report, benchmarks.bench_memory report) into OUT/super.md
#
# The device has no Ray, diffusers, structlog or imageio-ffmpeg of its own: their wheels (and their pure-Python
# needs) are carried in .whl/ and installed here, as for the Nano runs (benchmarks/results/h200-render.md).
set -euo pipefail

OUT=${1:?usage: benchmarks/super_one_gpu.sh OUT [write|clip|distilled|t2i|memory|nano|rerender|uncached|report ...]}
shift
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(write clip distilled report)
ROOT=${SUPER_ROOT:-/dev/shm/super}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

if compgen -G ".whl/*.whl" >/dev/null && ! "$PY" -c "import ray, structlog, diffusers, imageio_ffmpeg" 2>/dev/null; then
    "$PY" -m pip install --quiet --no-deps --no-index --no-compile .whl/*.whl
fi

stage_room() {
    # tmpfs /dev/shm is half the host's RAM by default (64 GiB of 128): the checkpoint needs ~70 GB.
    local avail
    avail=$(df --output=avail -B1G /dev/shm | tail -1)
    if [ "$avail" -lt 72 ]; then
        mount -o remount,size=100G /dev/shm
    fi
    df -h /dev/shm
}

write() {
    stage_room
    "$PY" -m benchmarks.bench_render write --root "$ROOT" --build super --variants fp8 \
        --link super-t2i super-t2i-4step super-i2v-4step | tee "$OUT/write.log"
    cp "$ROOT/write-all.json" "$OUT/write-super.json"
    du -sh "$ROOT"/fp8 "$ROOT"/super-* | tee -a "$OUT/write.log"
    free -g | tee -a "$OUT/write.log"
}

ensure_written() {
    [ -f "$ROOT/super-i2v-4step/transformer/config.json" ] || write
}

memory() {
    ensure_written
    "$PY" -m benchmarks.bench_memory run --root "$ROOT/fp8" --jobs t2v,t2i --steps 7 --out "$OUT/memory-super.json"
}

nano() {
    local nano=${NANO_ROOT:-/dev/shm/nano}
    [ -f "$nano/fp8/transformer/config.json" ] || "$PY" -m benchmarks.bench_render write --root "$nano" --variants fp8
    "$PY" -m benchmarks.bench_memory run --root "$nano/fp8" --jobs t2v,t2i --steps 7 --out "$OUT/memory-nano.json"
}

clip() {
    ensure_written
    # The read rate from the page cache (tmpfs is the page cache): cat, safetensors and our reader, to the GPU.
    "$PY" -m benchmarks.bench_read "$ROOT/fp8/transformer" | tee "$OUT/read-super.txt"
    "$PY" -m benchmarks.bench_render farm --root "$ROOT" --variant fp8 --attention fp8 --jobs t2i,t2i-seed2,t2v \
        --out "$OUT"
}

distilled() {
    ensure_written
    "$PY" -m benchmarks.bench_render farm --root "$ROOT" --variant super-t2i-4step --attention fp8 --jobs t2i-4step \
        --out "$OUT"
    "$PY" -m benchmarks.bench_render farm --root "$ROOT" --variant super-i2v-4step --attention fp8 --jobs i2v-4step \
        --out "$OUT"
}

t2i() {
    ensure_written
    "$PY" -m benchmarks.bench_render farm --root "$ROOT" --variant super-t2i --attention fp8 --jobs t2i,t2i-seed2 \
        --out "$OUT"
}

rerender() {
    ensure_written
    "$PY" -m benchmarks.bench_render farm --root "$ROOT" --variant fp8 --attention fp8 \
        --jobs t2i,t2i-seed2,t2v-short --rerenders 3 --out "$OUT/rerender"
}

uncached() {
    ensure_written
    "$PY" -m benchmarks.bench_render farm --root "$ROOT" --variant fp8 --attention fp8 --jobs t2v --cache off \
        --out "$OUT"
}

report() {
    {
        echo "# Cosmos3-Super on one $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) ($(date -u +%F), $(git rev-parse --short HEAD 2>/dev/null || echo tree))"
        echo
        "$PY" -m benchmarks.bench_render report "$OUT"/farm-*.json || true
        echo
        [ -f "$OUT/memory-super.json" ] && "$PY" -m benchmarks.bench_memory report "$OUT"/memory-*.json
        echo
        # What farm plan says of each run's manifest on this GPU and on an H100 80GB (NVML's 81,559 MiB = 79.6 GiB):
        # the need of every job, and which an H100 cannot hold (exit 1).
        for manifest in "$ROOT"/run-*/manifest.yaml; do
            echo '```'
            "$PY" -m farm plan "$manifest" || true
            "$PY" -m farm plan "$manifest" --gpu-memory 79.6 2>&1 | tail -n 2 || true
            echo '```'
        done
        for result in "$OUT"/rerender/farm-*.json; do
            [ -f "$result" ] && "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); \
print('re-renders byte-identical:', r['rerenders']['identical'])" "$result"
        done
    } | tee "$OUT/super.md"
}

for step in "${STEPS[@]}"; do
    echo "== $step ($(date -u +%T))"
    "$step"
done
