"""W8A16: the resident FP8 weight dequantized with its own weight_scale into a 16-bit GEMM.

Used on the denoising steps a checkpoint's ``diffusion_step_policy`` names, and for the UND
tower when the policy says ``reasoner: a16``. ``input_scale`` is unused and no dequantized
copy persists: the product is a per-call temporary. On CUDA the dequantization is one fused
pass (``torch.compile`` of the same expression, bit-identical; benchmarks/bench_w8a16.py
measures it against the eager form).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from cosmos3.quant.fp8_static import FP8, StaticFP8LinearMethod


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[out, in]`` e4m3 -> ``[out, in]`` 16-bit: ``W_fp8 * weight_scale`` in fp32, rounded once.

    On the CPU this is bit for bit ``W_fp8.to(bf16) * weight_scale`` (its kernels multiply a bf16
    tensor by an fp32 scalar tensor in fp32). CUDA's eager kernel rounds the scale to bf16 first
    and torch.compile's does not, so we state the one-rounding form (vLLM-Omni's) explicitly: the
    same bits on every device, eager or fused.
    """
    return (weight.float() * scale).to(dtype)


@functools.cache
def fused_dequantize():
    """``dequantize`` as one kernel instead of two (convert, then scale); compiled on first CUDA use."""
    return torch.compile(dequantize, dynamic=False)


def compile_fused_dequantize(linears, dtype: torch.dtype) -> None:
    """Compiles the fused dequantization for every weight shape of ``linears`` now (at a worker's start)
    rather than inside its first job: on the H200 a first Nano T2I spent 7.5 s of its UND stage there,
    the same UND 0.17 s once compiled (benchmarks/results/h200-2026-12-01-render.md)."""
    shapes = set()
    for linear in linears:
        if linear.weight.shape not in shapes:
            shapes.add(linear.weight.shape)
            fused_dequantize()(linear.weight, linear.weight_scale, dtype)


class W8A16LinearMethod(StaticFP8LinearMethod):
    """Same tensors as static FP8 (it is a different way to compute the same layer)."""

    high_precision = True
    shares_input_quant = False

    def fp8_output_scale(self, layer):
        return None

    def apply(self, layer, x):
        if x.dtype == FP8:
            raise TypeError(
                "W8A16 linear was handed an already-quantized FP8 activation; on a 16-bit step every "
                "sharing site must stand down (a bug in the caller)"
            )
        weight = (fused_dequantize() if x.is_cuda else dequantize)(layer.weight, layer.weight_scale, x.dtype)
        return F.linear(x, weight, layer.bias if layer.has_bias else None)
