"""W8A16: the resident FP8 weight dequantized with its own weight_scale into a 16-bit GEMM.

Used on the denoising steps a checkpoint's ``diffusion_step_policy`` names, and for the UND
tower when the policy says ``reasoner: a16``. ``input_scale`` is unused and no dequantized
copy persists: the product is a per-call temporary. On CUDA the dequantization is one pass of
our own kernel (``cosmos3.ops.dequantize_fp8``, bit-identical to ``dequantize``, nothing to
compile at a worker's start; benchmarks/bench_w8a16.py measures it against the eager form).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cosmos3 import ops
from cosmos3.quant.fp8_static import FP8, StaticFP8LinearMethod


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[out, in]`` e4m3 -> ``[out, in]`` 16-bit: ``W_fp8 * weight_scale`` in fp32, rounded once.

    On the CPU this is bit for bit ``W_fp8.to(bf16) * weight_scale`` (its kernels multiply a bf16
    tensor by an fp32 scalar tensor in fp32). CUDA's eager kernel rounds the scale to bf16 first,
    so we state the one-rounding form (vLLM-Omni's) explicitly: the same bits on every device, and
    those ``cosmos3.ops.dequantize_fp8`` computes in one CUDA pass.
    """
    return (weight.float() * scale).to(dtype)


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
        # The op makes bf16 or fp16 only; CPU pipelines run fp32.
        weight = (ops.dequantize_fp8 if x.is_cuda else dequantize)(layer.weight, layer.weight_scale, x.dtype)
        return F.linear(x, weight, layer.bias if layer.has_bias else None)
