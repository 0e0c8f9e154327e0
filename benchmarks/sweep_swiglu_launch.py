"""Measures the launch parameters of silu_and_mul_2in, quantize_fp8 and dequantize_fp8 on this GPU.

Times every (threads per block, vectors per thread) the kernels accept on M x I = 32760 x 16384 bf16 inputs
(dequantize_fp8: their FP8 quantization, to bf16) and prints, per config, the median time and the percentage
of the device-to-device copy bandwidth measured in the same run; then the best row for this SM version, to paste
into cosmos3/launch_table.py. silu_and_mul_2in is ranked by its FP8-output time (the static-FP8 MLP path); its
bf16-output time is shown beside it.

    python benchmarks/sweep_swiglu_launch.py [--reps 50]
"""

from __future__ import annotations

import argparse

import torch
from bench_swiglu import copy_tbps, machine_line, median_ms

from cosmos3 import ops, ops_loader
from cosmos3.launch_table import LaunchParams

M, I = 32760, 16384  # noqa: E741 - the kernels' M x I (tokens x intermediate) notation
CONFIGS = [LaunchParams(t, v) for t in (64, 128, 256, 512, 1024) for v in (1, 2, 4) if t * v <= 1024]


def sweep(ext, sm: int, op: str, variants: dict[str, tuple], reps: int, copy: float) -> LaunchParams:
    """Times op under every config; variants maps a column name to (callable, bytes moved). The first ranks."""
    print(f"\n{op}")
    print("| threads | vectors/thread | " + " | ".join(f"{name} ms | % copy" for name in variants) + " |")
    best, best_ms = None, float("inf")
    for params in CONFIGS:
        ops_loader.set_launch_params(ext, sm, {op: params})
        times = [median_ms(fn, reps) for fn, _ in variants.values()]
        cells = [f"{ms:.4f} | {100 * nbytes / ms / 1e9 / copy:5.1f}%"
                 for ms, (_, nbytes) in zip(times, variants.values(), strict=True)]
        print(f"| {params.threads:7d} | {params.vectors_per_thread:14d} | " + " | ".join(cells) + " |")
        if times[0] < best_ms:
            best, best_ms = params, times[0]
    print(f"best: {best} at {best_ms:.4f} ms")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()

    ext = ops.load_cuda_ops().module
    sm = ops_loader.sm_version(torch.cuda.current_device())
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate = (torch.randn(M, I, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    up = (torch.randn(M, I, device="cuda", generator=gen) * 2).to(torch.bfloat16)
    scale = torch.tensor([0.02], device="cuda")
    weight = ops.quantize_fp8(gate, scale)
    n = M * I
    copy = copy_tbps(args.reps)
    print(machine_line())
    print(f"M x I = {M} x {I}, bf16 inputs; copy {copy:.2f} TB/s; median of {args.reps} runs per cell")

    row = {
        "silu_and_mul_2in": sweep(ext, sm, "silu_and_mul_2in", {
            "fp8 out": (lambda: ops.silu_and_mul_2in(gate, up, scale=scale), 5 * n),
            "bf16 out": (lambda: ops.silu_and_mul_2in(gate, up), 6 * n),
        }, args.reps, copy),
        "quantize_fp8": sweep(ext, sm, "quantize_fp8", {
            "bf16 in": (lambda: ops.quantize_fp8(gate, scale), 3 * n),
        }, args.reps, copy),
        "dequantize_fp8": sweep(ext, sm, "dequantize_fp8", {
            "bf16 out": (lambda: ops.dequantize_fp8(weight, scale, torch.bfloat16), 3 * n),
        }, args.reps, copy),
    }
    print(f"\nlaunch_table.py row for sm_{sm}:")
    print(f"    {sm}: {{" + ", ".join(f'"{op}": LaunchParams(threads={p.threads}, vectors_per_thread='
                                     f'{p.vectors_per_thread})' for op, p in row.items()) + "},")


if __name__ == "__main__":
    main()
