"""High-precision Linear: BF16 (or fp32 for CPU reference runs), fused shards concatenated at load."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cosmos3.quant.base import LinearMethod, ShardTensors


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer, dtype):
        layer.weight = torch.nn.Parameter(torch.empty(layer.out_features, layer.in_features, dtype=dtype), False)
        if layer.has_bias:
            layer.bias = torch.nn.Parameter(torch.empty(layer.out_features, dtype=dtype), False)

    def checkpoint_tensors(self, layer):
        return ("weight", "bias") if layer.has_bias else ("weight",)

    def load_weights(self, layer, shards: ShardTensors, name: str):
        # Fused topology: shards are concatenated along the output dim in shard_keys order.
        for suffix in self.checkpoint_tensors(layer):
            param = getattr(layer, suffix)
            full = torch.cat([shards[key][suffix] for key in layer.shard_keys], dim=0)
            param.data.copy_(full.to(param.dtype))

    def apply(self, layer, x):
        return F.linear(x, layer.weight, layer.bias if layer.has_bias else None)
