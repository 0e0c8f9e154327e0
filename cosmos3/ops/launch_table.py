"""Launch parameters of the csrc/ kernels, keyed by SM version (``10 * major + minor``).

Each op's kernel is a flat elementwise map: a block of ``threads`` threads, each loading
``vectors_per_thread`` 16-byte vectors of every input before it computes (so that many loads are in
flight), over a grid that covers the whole tensor. ``cosmos3.ops.loader.load_cuda_ops`` hands every visible
device's row to the CUDA extension; ``benchmarks/bench_ops.py launch`` measures a new row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

OPS = ("silu_and_mul_2in", "quantize_fp8", "dequantize_fp8")


@dataclass(frozen=True)
class LaunchParams:
    threads: int  # per block: a power of two in [32, 1024]
    vectors_per_thread: int  # 1, 2 or 4; threads * vectors_per_thread <= 1024 (the kernel's launch bounds)


# Any arch without a row: 128-thread blocks of two vectors per thread, within 8% of the best config for every
# op on the H200 and needing only 16 resident blocks per SM for full occupancy (64-thread blocks need 32).
DEFAULT: dict[str, LaunchParams] = {op: LaunchParams(threads=128, vectors_per_thread=2) for op in OPS}

# sm_90 (H200) was measured with benchmarks/bench_ops.py launch on an H200 (132 SMs, torch 2.11+cu130,
# CUDA 13.0), M x I = 32760 x 16384 bf16, on 2026-11-30 with the Newton-step sigmoid and the reciprocal-and-fma
# division; 64x4 won all five silu_and_mul_2in sweeps of the day. silu_and_mul_2in, FP8 out: 64x4 0.656 ms
# (95.7% of the 4.27 TB/s copy) against 256x4 0.667, 64x2 0.697, 128x2 0.700, 1024x1 0.892 ms; quantize_fp8:
# 64x2 0.369 ms (102%), 128x2 and 512x2 within 0.1%, 256x1 0.406 ms.
# The sweep runs the GPU at its power cap (lower SM clock), so its FP8 swiglu times are 5-10% above the
# bandwidth run's for the same config (benchmarks/results/h200-kernels.md); the ranking held in every sweep.
# dequantize_fp8, FP8 in and bf16 out, one sweep on 2026-12-01 (benchmarks/results/h200-kernels.md):
# 64x2 0.396 ms (95.3%), 256x2 0.398, 1024x1 0.398, 128x2 0.399, 64x4 0.427 ms; not yet repeated as the others were.
_H200 = {"silu_and_mul_2in": LaunchParams(threads=64, vectors_per_thread=4),
         "quantize_fp8": LaunchParams(threads=64, vectors_per_thread=2),
         "dequantize_fp8": LaunchParams(threads=64, vectors_per_thread=2)}

TABLE: dict[int, dict[str, LaunchParams]] = {
    90: _H200,
    # sm_100 (B200): NOT measured (no B200 was available): the H200 row as a starting point. B200 has more
    # bandwidth per SM and may prefer more loads in flight; run the sweep there and replace this row.
    100: _H200,
}


def launch_params(sm: int) -> dict[str, LaunchParams]:
    """The row for ``sm``, or DEFAULT (logged once per SM version) for an arch the table does not know."""
    row = TABLE.get(sm)
    if row is None:
        _log_unknown_arch(sm)
        return DEFAULT
    return row


@functools.cache
def _log_unknown_arch(sm: int) -> None:
    log.warning("no measured launch parameters for this GPU; using safe defaults", sm=sm,
                default={op: (p.threads, p.vectors_per_thread) for op, p in DEFAULT.items()},
                fix="run benchmarks/bench_ops.py launch and add a row to cosmos3/ops/launch_table.py")
