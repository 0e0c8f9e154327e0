"""W8A16 on Nano's GEN weight shapes: dequantize as a per-call temporary, eager torch vs our op (needs CUDA).

Eager ``(W.float() * weight_scale).to(bf16)`` is several kernels (convert, scale, round: 13
bytes moved per weight); ``cosmos3.ops.dequantize_fp8`` is one (3 bytes). Both must be
bit-identical.
Prints per shape: dequant time both ways, and the whole W8A16 linear against a BF16 linear.

    python benchmarks/bench_w8a16.py --tokens 1024 44160
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_transformer import timed  # noqa: E402
from cosmos3 import ops  # noqa: E402
from cosmos3.ops_cpu import dequantize_fp8 as dequantize  # noqa: E402  (the eager reference expression)

# GEN tower projections of one Nano layer: Q, K (= V), O, gate (= up), down.
SHAPES = {"q / o": (4096, 4096), "k / v": (1024, 4096), "gate / up": (12288, 4096), "down": (4096, 12288)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 44160])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, sm_{props.major}{props.minor}, CUDA {torch.version.cuda}, torch {torch.__version__}")
    print("| weight [out, in] | tokens | dequant eager ms | dequant op ms | op vs eager | bit-identical "
          "| bf16 linear ms | w8a16 linear (op) ms | w8a16 vs bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (out_f, in_f) in SHAPES.items():
        w_bf16 = (0.02 * torch.randn(out_f, in_f, device="cuda")).bfloat16()
        scale = (w_bf16.float().abs().amax() / 448).reshape(())
        w_fp8 = (w_bf16.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        same = torch.equal(dequantize(w_fp8, scale, torch.bfloat16).view(torch.int16),
                           ops.dequantize_fp8(w_fp8, scale, torch.bfloat16).view(torch.int16))
        eager_ms = timed(lambda: dequantize(w_fp8, scale, torch.bfloat16), args.iters, 3)
        op_ms = timed(lambda: ops.dequantize_fp8(w_fp8, scale, torch.bfloat16), args.iters, 3)
        for n in args.tokens:
            x = torch.randn(n, in_f, device="cuda", dtype=torch.bfloat16)
            bf16_ms = timed(lambda: F.linear(x, w_bf16), args.iters, 3)
            w8a16_ms = timed(lambda: F.linear(x, ops.dequantize_fp8(w_fp8, scale, torch.bfloat16)), args.iters, 3)
            print(f"| {name} {out_f}x{in_f} | {n:,} | {eager_ms:.3f} | {op_ms:.3f} | {eager_ms / op_ms:.2f}x "
                  f"| {same} | {bf16_ms:.3f} | {w8a16_ms:.3f} | {w8a16_ms / bf16_ms:.2f}x |")


if __name__ == "__main__":
    main()
