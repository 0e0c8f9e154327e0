"""ModelOpt static per-tensor FP8 (W8A8): every tensor and scale exactly as calibrated.

``x_fp8 = sat_e4m3(x / input_scale)``; ``y = (x_fp8 @ W_fp8^T) * input_scale * weight_scale (+ b)``
through ``torch._scaled_mm`` on CUDA, summed as the load option ``fp8_accumulation`` says (cosmos3.rules.load_options),
and on the CPU as an fp32 product of the same e4m3 operands (see ``scaled_mm``). A layer is
never fused: each projection keeps its own weight_scale, so nothing is rounded twice (projections that read one
input may run as one GEMM with per-column scales, the same products: cosmos3/layers/packed.py). Scales
may be 0-d (as ModelOpt writes them) or one element; they load with their shape and bytes.
The decoder projections are bias-free; proj_in, proj_out and the time_embedder linears, when
a checkpoint quantizes them, carry a high-precision bias added after the scaled GEMM.
"""

from __future__ import annotations

import torch

from cosmos3 import ops
from cosmos3.errors import CheckpointError
from cosmos3.ops import FP8, FP8_MAX
from cosmos3.quant.base import LinearMethod, ShardTensors, require_dtype, require_scalar_scale

# ModelOpt duplicates each scale in a buffer; we check them against the scale, then drop them.
MODELOPT_BUFFERS = {
    "weight_quantizer._amax": ("weight_scale", FP8_MAX),
    "weight_quantizer._scale": ("weight_scale", 1.0),
    "input_quantizer._amax": ("input_scale", FP8_MAX),
}


def scaled_mm(x_fp8: torch.Tensor, weight: torch.Tensor, scale_a, scale_b, out_dtype, *,
              accumulation: str) -> torch.Tensor:
    """``[..., K] fp8 x [N, K] fp8 -> [..., N]`` with scales read on the device: per tensor (0-d or [1]), or per
    row ``[M, 1]`` and per column ``[1, N]`` (a packed group, cosmos3/layers/packed.py). ``accumulation`` is one
    of ``cosmos3.rules.load_options.FP8_ACCUMULATIONS``: on CUDA, "fast" sums in the tensor cores' accumulator and
    "fp32" promotes the partial sums to fp32 every K block.

    On the CPU the operands go up to fp32, which holds every e4m3 value exactly: the same scaled product with
    fp32 accumulation, in another summation order. oneDNN's FP8 matmul is its reference loop on CPUs without
    FP8 instructions (a 256x256x256 product took 0.54 s against 0.4 ms in fp32 on an AMX-BF16 Xeon), which made
    a toy still 34 s instead of 1.3 s.
    """
    x2d = x_fp8.reshape(-1, x_fp8.shape[-1])  # [M, K]
    if x2d.is_cuda:
        y = torch._scaled_mm(x2d, weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
                             use_fast_accum=accumulation == "fast")
    else:
        y = (x2d.float() @ weight.float().t() * (scale_a.float() * scale_b.float())).to(out_dtype)
    return y.reshape(*x_fp8.shape[:-1], weight.shape[0])


class StaticFP8LinearMethod(LinearMethod):
    shares_input_quant = True

    def __init__(self, accumulation: str):
        self.accumulation = accumulation  # how scaled_mm sums (cosmos3.rules.load_options.FP8_ACCUMULATIONS)

    def create_weights(self, layer, dtype):
        if layer.is_fused:
            raise ValueError(f"static FP8 keeps projections split; got a fused layer over {layer.shard_keys}")
        layer.weight = torch.nn.Parameter(torch.empty(layer.out_features, layer.in_features, dtype=FP8), False)
        layer.weight_scale = torch.nn.Parameter(torch.empty((), dtype=torch.float32), False)
        layer.input_scale = torch.nn.Parameter(torch.empty((), dtype=torch.float32), False)
        if layer.has_bias:
            layer.bias = torch.nn.Parameter(torch.empty(layer.out_features, dtype=dtype), False)
        layer.out_dtype = dtype

    def checkpoint_tensors(self, layer):
        return ("weight", "weight_scale", "input_scale") + (("bias",) if layer.has_bias else ())

    def load_weights(self, layer, shards: ShardTensors, name: str):
        (tensors,) = shards.values()
        require_dtype(tensors["weight"], FP8, f"{name}.weight (static FP8 recipe)")
        for suffix in ("weight_scale", "input_scale"):
            require_scalar_scale(tensors[suffix], f"{name}.{suffix}")
        check_modelopt_buffers(tensors, name)
        # Keep the checkpoint's exact tensors (shape and bytes): state_dict() must give them back. The weight (its
        # shape checked by the loader) goes into the parameter made for it, which may be a packed group's slice
        # (cosmos3/layers/packed.py); the scales keep their stored shape, 0-d or [1].
        layer.weight.data.copy_(tensors["weight"])
        for suffix in ("weight_scale", "input_scale"):
            setattr(layer, suffix, torch.nn.Parameter(tensors[suffix].to(layer.weight.device).clone(), False))
        if layer.has_bias:
            layer.bias.data.copy_(tensors["bias"].to(layer.bias.dtype))

    def quantize_input(self, layer, x):
        return ops.quantize_fp8(x.contiguous(), layer.input_scale.reshape(1))

    def fp8_output_scale(self, layer):
        return layer.input_scale.reshape(1)

    def apply(self, layer, x):
        # A group shares one quantization: a pre-quantized FP8 input passes straight through.
        x_fp8 = x if x.dtype == FP8 else self.quantize_input(layer, x)
        y = scaled_mm(x_fp8, layer.weight, layer.input_scale, layer.weight_scale, layer.out_dtype,
                      accumulation=self.accumulation)
        return y + layer.bias if layer.has_bias else y


def check_modelopt_buffers(tensors: dict[str, torch.Tensor], name: str) -> None:
    """ModelOpt buffers, where present, must agree with the scales they duplicate."""
    for buffer, (scale_name, factor) in MODELOPT_BUFFERS.items():
        if buffer not in tensors:
            continue
        expected = tensors[scale_name].float() * factor
        if not torch.allclose(tensors[buffer].float().reshape(()), expected.reshape(()), rtol=1e-6, atol=0):
            raise CheckpointError(
                f"{name}.{buffer} = {tensors[buffer].item():.8g} disagrees with {name}.{scale_name} * {factor:g} "
                f"= {expected.item():.8g}; the checkpoint's scales are inconsistent (re-export it)"
            )
