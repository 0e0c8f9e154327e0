"""RMSNorm in fp32: ``x * rsqrt(mean(x^2) + eps) * weight``, rounded once to the input dtype.

One fused kernel on CUDA (``F.rms_norm``); a GEN layer runs four of these per step, and at small
token counts the eight-kernel unfused form cost more than the layer's attention. diffusers rounds
the normalized value to bf16 before the weight multiply; we round once (identical in fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
