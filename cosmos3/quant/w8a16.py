"""W8A16: the resident FP8 weight dequantized with its own weight_scale into a 16-bit GEMM.

Used on the denoising steps a checkpoint's ``diffusion_step_policy`` names, and for the UND
tower when the policy says ``reasoner: a16``. ``input_scale`` is unused and no dequantized
copy persists: the product is a per-call temporary. On CUDA the dequantization is one pass of
our own kernel (``cosmos3.ops.dequantize_fp8``, nothing to compile at a worker's start); elsewhere
its reference expression ``cosmos3.ops_cpu.dequantize_fp8``, the same bits (benchmarks/bench_w8a16.py
measures the kernel against that expression run eagerly on CUDA).
"""

from __future__ import annotations

import torch.nn.functional as F

from cosmos3 import ops, ops_cpu
from cosmos3.quant.fp8_static import FP8, StaticFP8LinearMethod


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
        # The CUDA op makes bf16 or fp16 only; CPU pipelines run fp32, through the op's reference expression.
        dequantize = ops.dequantize_fp8 if x.is_cuda else ops_cpu.dequantize_fp8
        weight = dequantize(layer.weight, layer.weight_scale, x.dtype)  # [out, in], a per-call temporary
        return F.linear(x, weight, layer.bias if layer.has_bias else None)
