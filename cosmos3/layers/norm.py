"""RMSNorm in fp32: ``x * rsqrt(mean(x^2) + eps) * weight``, rounded once to the input dtype.

Each use is one ``torch.ops.cosmos3`` kernel together with its neighbours in the layer: ``add`` takes the
residual add before the norm, ``scale`` the FP8 quantization after it (a norm that feeds static W8A8
projections). The QK norms only hold their weights: ``cosmos3.ops.attention_inputs`` (in MoTAttention)
normalizes q and k, applies RoPE and appends k and v to the UND K/V in one kernel. Run as kernels of
their own, those neighbours are ten launches a GEN layer at a still's 1,024 tokens (benchmarks/results/h200-kernels.md).
diffusers rounds the normalized value to bf16 before the weight multiply; we round once (identical in fp32).
"""

from __future__ import annotations

import torch
from torch import nn

from cosmos3 import ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., dim]`` -> ``[..., dim]`` in x's dtype, or FP8 quantized with ``scale``."""
        return ops.rms_norm(x, self.weight, self.eps, scale=scale)

    def add(self, x: torch.Tensor, delta: torch.Tensor, *,
            scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream ``x + delta`` ``[..., dim]`` and its norm (FP8 with ``scale``)."""
        return ops.add_rms_norm(x, delta, self.weight, self.eps, scale=scale)
