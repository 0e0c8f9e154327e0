"""Launch parameters of the csrc/ kernels, keyed by SM version (``10 * major + minor``).

Each op's kernel is a flat elementwise map: a block of ``threads`` threads, each loading
``vectors_per_thread`` 16-byte vectors of every input before it computes (so that many loads are in
flight), over a grid that covers the whole tensor. ``cosmos3.ops.load_cuda_ops`` hands every visible
device's row to the CUDA extension; ``benchmarks/sweep_swiglu_launch.py`` measures a new row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

OPS = ("silu_and_mul_2in", "quantize_fp8")


@dataclass(frozen=True)
class LaunchParams:
    threads: int  # per block: a power of two in [32, 1024]
    vectors_per_thread: int  # 1, 2 or 4; threads * vectors_per_thread <= 1024 (the kernel's launch bounds)


# Any arch: 256-thread blocks of one vector per thread, the recipe every memory-bound kernel converges on
# (kernels.md section 0) and far from any register or occupancy limit.
DEFAULT: dict[str, LaunchParams] = {op: LaunchParams(threads=256, vectors_per_thread=1) for op in OPS}

TABLE: dict[int, dict[str, LaunchParams]] = {
    # H200 (sm_90): to be measured by benchmarks/sweep_swiglu_launch.py.
    90: dict(DEFAULT),
    # B200 (sm_100): NOT measured (no B200 was available); the sm_90 recipe, pending a sweep on a B200.
    100: dict(DEFAULT),
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
                fix="run benchmarks/sweep_swiglu_launch.py and add a row to cosmos3/launch_table.py")
