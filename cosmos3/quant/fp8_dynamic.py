"""Dynamic FP8: a BF16 checkpoint quantized per tensor at load; activations scaled per call.

The activation scale ``amax(|x|) / 448`` is computed on the device (no host read), so this
stays graph-capturable. Fused shards are quantized together: there is no calibrated scale to
preserve, so one per-tensor scale over the fused weight is exact for this recipe.
"""

from __future__ import annotations

import torch

from cosmos3 import ops
from cosmos3.quant.base import LinearMethod, ShardTensors
from cosmos3.quant.fp8_static import FP8, FP8_MAX, scaled_mm


def per_tensor_scale(t: torch.Tensor) -> torch.Tensor:
    """``amax(|t|) / 448`` as an fp32 ``[1]`` tensor, floored so an all-zero tensor stays finite."""
    return (t.abs().amax().float() / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny).reshape(1)


class DynamicFP8LinearMethod(LinearMethod):
    def __init__(self, accumulation: str):
        self.accumulation = accumulation  # how scaled_mm sums (cosmos3.rules.load_options.FP8_ACCUMULATIONS)

    def create_weights(self, layer, dtype):
        layer.weight = torch.nn.Parameter(torch.empty(layer.out_features, layer.in_features, dtype=FP8), False)
        layer.weight_scale = torch.nn.Parameter(torch.empty(1, dtype=torch.float32), False)
        if layer.has_bias:
            layer.bias = torch.nn.Parameter(torch.empty(layer.out_features, dtype=dtype), False)
        layer.out_dtype = dtype

    def checkpoint_tensors(self, layer):
        return ("weight", "bias") if layer.has_bias else ("weight",)

    def load_weights(self, layer, shards: ShardTensors, name: str):
        full = torch.cat([shards[key]["weight"] for key in layer.shard_keys], dim=0)
        full = full.to(layer.weight.device, torch.float32)
        scale = per_tensor_scale(full)
        layer.weight_scale.data.copy_(scale)
        layer.weight.data.copy_(ops.quantize_fp8(full.contiguous(), scale))
        if layer.has_bias:
            bias = torch.cat([shards[key]["bias"] for key in layer.shard_keys], dim=0)
            layer.bias.data.copy_(bias.to(layer.bias.dtype))

    def apply(self, layer, x):
        x_scale = per_tensor_scale(x)
        x_fp8 = ops.quantize_fp8(x.contiguous(), x_scale)
        y = scaled_mm(x_fp8, layer.weight, x_scale, layer.weight_scale, layer.out_dtype, accumulation=self.accumulation)
        return y + layer.bias if layer.has_bias else y
