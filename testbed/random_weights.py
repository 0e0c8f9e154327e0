"""A random Cosmos3 checkpoint in memory, named and shaped by our own model: no diffusers needed (the GPU
machine has none). Norm weights are 1 + 0.05 N(0, 1), every other tensor 0.02 N(0, 1)."""

from __future__ import annotations

import torch

from cosmos3.checkpoint.weights import _linear_sources
from cosmos3.layers.linear import Linear
from cosmos3.rules.config import Cosmos3Config
from cosmos3.transformer import Cosmos3Transformer


def random_checkpoint(cfg: dict, device: str = "cuda") -> dict:
    """Checkpoint name -> random tensor for the transformer config ``cfg`` (shapes from a meta-device model)."""
    with torch.device("meta"):
        model = Cosmos3Transformer(Cosmos3Config.from_dict(cfg))
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    shapes = {name: (t.shape, t.dtype) for name, t in model.state_dict().items()
              if name.rsplit(".", 1)[0] not in linears}
    for name, linear in linears.items():
        for (_, prefix), width in zip(_linear_sources(name, linear), linear.shard_sizes, strict=True):
            shapes[f"{prefix}.weight"] = ((width, linear.in_features), torch.bfloat16)
            if linear.has_bias:
                shapes[f"{prefix}.bias"] = ((width,), torch.bfloat16)
    state = {}
    for name, (shape, dtype) in shapes.items():
        t = torch.randn(shape, device=device, dtype=dtype)
        state[name] = (1.0 + 0.05 * t) if "norm" in name else 0.02 * t
    return state
