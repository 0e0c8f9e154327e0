"""Launch parameters of the elementwise csrc/ kernels (``OPS``), keyed by SM version (``10 * major + minor``).

The norm kernels (``rms_norm``, ``add_rms_norm``, ``attention_inputs``) take no row here: their 256-thread blocks
hold whole rows, the lanes a row gets set by its length (csrc/rms_norm.cu). Each op of ``OPS`` is a flat elementwise
map: a block of ``threads`` threads, each loading ``vectors_per_thread`` 16-byte vectors of every input before it
computes (so that many loads are in flight), over a grid that covers the whole tensor.
``cosmos3.ops.loader.load_cuda_ops`` hands every visible device's row to the CUDA extension;
``benchmarks/bench_ops.py launch`` measures a new row.
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

# sm_90: the fastest config of each op in bench_ops.py launch's sweeps on an H200 (benchmarks/results/h200-kernels.md,
# "The launch table": every config's time, and how the sweeps were run).
_H200 = {"silu_and_mul_2in": LaunchParams(threads=64, vectors_per_thread=4),
         "quantize_fp8": LaunchParams(threads=64, vectors_per_thread=2),
         "dequantize_fp8": LaunchParams(threads=64, vectors_per_thread=2)}

TABLE: dict[int, dict[str, LaunchParams]] = {
    90: _H200,
    # sm_100 (B200) runs the sm_90 row: no sweep has run on a B200. Its greater bandwidth per SM may favour more
    # loads in flight; `bench_ops.py launch` there gives it a row of its own.
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
