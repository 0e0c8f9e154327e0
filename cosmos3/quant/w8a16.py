"""W8A16: the resident FP8 weight dequantized with its own weight_scale into a 16-bit GEMM.

Used on the denoising steps a checkpoint's ``diffusion_step_policy`` names, and for the UND
tower when the policy says ``reasoner: a16``. ``input_scale`` is unused. The dequantized weight is a
per-call temporary, unless a ``DequantizedWeights`` holds it for the model's step precision (``layer.dequantized``
reads it): the same bits, made once for many forwards. On CUDA the dequantization is one pass of our own kernel
(``cosmos3.ops.dequantize_fp8``, nothing to compile at a worker's start); elsewhere its reference
expression ``cosmos3.ops.cpu.dequantize_fp8``, the same bits (benchmarks/bench_ops.py bandwidth measures the
kernel against that expression, eager and compiled, on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from cosmos3 import ops
from cosmos3.ops import FP8
from cosmos3.ops import cpu as ops_cpu
from cosmos3.quant.fp8_static import StaticFP8LinearMethod
from cosmos3.quant.step_precision import StepPrecision


def dequantize(layer, dtype: torch.dtype) -> torch.Tensor:
    """``layer``'s FP8 weight times its weight_scale, ``[out, in]`` in ``dtype``. The CUDA op makes bf16 or fp16
    only; CPU pipelines run fp32, through the op's reference expression."""
    op = ops.dequantize_fp8 if layer.weight.is_cuda else ops_cpu.dequantize_fp8
    return op(layer.weight, layer.weight_scale, dtype)


class W8A16LinearMethod(StaticFP8LinearMethod):
    """Same tensors as static FP8 (it is a different way to compute the same layer)."""

    shares_input_quant = False

    def __init__(self):
        super().__init__(accumulation=None)  # its GEMMs are 16-bit (F.linear): no FP8 accumulation to choose

    def fp8_output_scale(self, layer):
        return None

    def apply(self, layer, x):
        if x.dtype == FP8:
            raise TypeError(
                "W8A16 linear was handed an already-quantized FP8 activation; on a 16-bit step every "
                "sharing site must stand down (a bug in the caller)"
            )
        weight = layer.dequantized
        if weight is None or weight.dtype != x.dtype:
            weight = dequantize(layer, x.dtype)  # [out, in], a per-call temporary
        return F.linear(x, weight, layer.bias if layer.has_bias else None)


class DequantizedWeights:
    """The weights of static-FP8 ``linears`` dequantized once into ``dtype``, held by ``step_precision`` (the model's
    ``StepPrecision``) until ``release()``: their W8A16 passes then read these instead of dequantizing every call.

    Costs a 16-bit copy of those weights (Nano's GEN tower: 13.8 GB). Worth it where a forward is short: on the
    H200 a W8A16 GEN forward at a still's 1,024 tokens spent ~5.7 ms of its ~30 ms dequantizing, and a still runs
    nine of them (benchmarks/results/h200-render.md; cosmos3/cuda_graphs.py decides when to hold one).
    """

    def __init__(self, step_precision: StepPrecision, linears: Sequence, dtype: torch.dtype):
        self.step_precision = step_precision
        self.linears = list(linears)
        step_precision.held = {linear: dequantize(linear, dtype) for linear in self.linears}

    @staticmethod
    def nbytes(linears: Sequence, dtype: torch.dtype) -> int:
        """What holding ``linears`` dequantized in ``dtype`` takes."""
        return sum(linear.weight.numel() for linear in linears) * dtype.itemsize

    def release(self) -> None:
        self.step_precision.held = None
        self.linears = []
