"""silu_and_mul_2in (and quantize_fp8, dequantize_fp8) against the copy ceiling, torch.compile and eager PyTorch.

Prints the machine, the device-to-device copy bandwidth measured in this run, then per shape and output:
the op's median time, its effective bandwidth (bytes read + written / time), that as a percentage of the
copy bandwidth and of a copy moving the same number of bytes (small shapes pay launch and tail costs a
4 GiB copy does not), and how many times faster it is than torch.compile and than eager PyTorch of the
same formula. Times are medians of CUDA-event-timed runs after warm-up (each at least 25 ms of GPU work).

    python benchmarks/bench_swiglu.py [--reps 30]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cosmos3 import ops
from cosmos3.ops_cpu import dequantize_fp8 as dequantize  # the reference expression, eager or compiled

SHAPES = [(32760, 16384), (8192, 16384), (1760, 12288)]  # [M, I]: Cosmos3 MLP activations
COPY_BYTES = 4 << 30
SCALE = 0.02


def machine_line() -> str:
    props = torch.cuda.get_device_properties(0)
    return (f"{props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
            f"CUDA {torch.version.cuda}, torch {torch.__version__}")


def median_ms(fn: Callable[[], object], reps: int, min_total_ms: float = 25.0) -> float:
    """Median CUDA-event time of ``fn``. Warm-up and timed runs each last at least ``min_total_ms`` of GPU
    time (a short kernel gets more runs), so clocks have settled and short kernels are not timed cold."""
    fn()  # first call: build, compile, allocate
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    runs = max(reps, math.ceil(min_total_ms / max(start.elapsed_time(end), 1e-3)))
    for _ in range(runs):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def copy_tbps(reps: int, nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy bandwidth of an ``nbytes`` copy, bytes read plus written, in TB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / median_ms(lambda: dst.copy_(src), reps) / 1e9


def swiglu_formula(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    y = F.silu(gate.float()) * up.float()
    return y.to(gate.dtype) if scale is None else (y / scale).clamp(-448, 448).to(ops.FP8)


def quantize_formula(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-448, 448).to(ops.FP8)


@dataclass
class Case:
    name: str
    ours: Callable[[], torch.Tensor]
    formula: Callable[..., torch.Tensor]
    args: tuple
    bytes_moved: int


def cases(m: int, i: int) -> list[Case]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate = (torch.randn(m, i, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    up = (torch.randn(m, i, device="cuda", generator=gen) * 2).to(torch.bfloat16)
    scale = torch.tensor([SCALE], device="cuda")
    weight = ops.quantize_fp8(gate, scale)
    n = m * i
    return [
        Case("swiglu bf16->fp8", lambda: ops.silu_and_mul_2in(gate, up, scale=scale), swiglu_formula,
             (gate, up, scale), 5 * n),
        Case("swiglu bf16->bf16", lambda: ops.silu_and_mul_2in(gate, up), swiglu_formula, (gate, up, None), 6 * n),
        Case("quantize bf16->fp8", lambda: ops.quantize_fp8(gate, scale), quantize_formula, (gate, scale), 3 * n),
        Case("dequant fp8->bf16", lambda: ops.dequantize_fp8(weight, scale, torch.bfloat16), dequantize,
             (weight, scale, torch.bfloat16), 3 * n),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()

    ops.load_cuda_ops()
    compiled = {f: torch.compile(f, fullgraph=True) for f in (swiglu_formula, quantize_formula, dequantize)}
    copy = copy_tbps(args.reps)
    print(machine_line())
    print(f"device-to-device copy: {copy:.2f} TB/s (read + write, {COPY_BYTES >> 30} GiB, median of {args.reps})")
    print(f"| {'M x I':>13} | {'op':<18} | {'ours ms':>8} | {'TB/s':>5} | {'% copy':>6} | {'% same-size copy':>16} | "
          f"{'compile ms':>10} | {'x compile':>9} | {'eager ms':>8} | {'x eager':>7} |")
    print(f"|{'-' * 15}|{'-' * 20}|{'-' * 10}|{'-' * 7}|{'-' * 8}|{'-' * 18}|{'-' * 12}|{'-' * 11}|{'-' * 10}|"
          f"{'-' * 9}|")
    for m, i in SHAPES:
        for case in cases(m, i):
            ours = median_ms(case.ours, args.reps)
            comp = median_ms(lambda: compiled[case.formula](*case.args), args.reps)
            eager = median_ms(lambda: case.formula(*case.args), 3)
            tbps = case.bytes_moved / ours / 1e9
            same_size = copy_tbps(args.reps, case.bytes_moved // 2)  # a copy reads and writes half each
            print(f"| {f'{m} x {i}':>13} | {case.name:<18} | {ours:8.3f} | {tbps:5.2f} | {100 * tbps / copy:5.1f}% | "
                  f"{100 * tbps / same_size:15.1f}% | {comp:10.3f} | {comp / ours:8.2f}x | {eager:8.3f} | "
                  f"{eager / ours:6.1f}x |")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
