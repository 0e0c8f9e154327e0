"""Token embeddings of the GEN stream: patchify, timestep embedding, action domain heads."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_timestep(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """``[N]`` -> ``[N, dim]`` fp32, cos first: ``[cos(t f_i), sin(t f_i)]``, ``f_i = exp(-ln(P) i / (dim/2))``."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
    angles = t[:, None].float() * torch.exp(exponent)[None, :]  # [N, half]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TimestepEmbedding(nn.Module):
    """256-d sinusoid -> ``linear_2(silu(linear_1(e)))``; kept in fp32 whatever the model dtype.

    ``make_linear(name, in_features, out_features)`` builds each (biased, fp32) Linear: high
    precision, or W8A8 when a checkpoint quantized it.
    """

    def __init__(self, hidden_size: int, make_linear, in_channels: int = 256):
        super().__init__()
        self.in_channels = in_channels
        self.linear_1 = make_linear("linear_1", in_channels, hidden_size)
        self.linear_2 = make_linear("linear_2", hidden_size, hidden_size)
        self.requires_grad_(False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        e = sinusoidal_timestep(t.reshape(-1), self.in_channels)  # [N, 256]
        return self.linear_2(nn.functional.silu(self.linear_1(e)))  # [N, H] fp32


def patchify(latents: torch.Tensor, p: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``[C, T, H, W]`` -> ``[T*Hp*Wp, p*p*C]`` in ``thwpqc`` order, zero-padding H, W up to multiples of p."""
    c, t, h, w = latents.shape
    pad_h, pad_w = -h % p, -w % p
    if pad_h or pad_w:
        latents = nn.functional.pad(latents, (0, pad_w, 0, pad_h))
    hp, wp = (h + pad_h) // p, (w + pad_w) // p
    x = latents.reshape(c, t, hp, p, wp, p).permute(1, 2, 4, 3, 5, 0)  # [T, Hp, Wp, p, q, C]
    return x.reshape(t * hp * wp, p * p * c), (t, hp, wp)


def unpatchify(tokens: torch.Tensor, grid: tuple[int, int, int], p: int, size: tuple[int, int]) -> torch.Tensor:
    """Exact inverse of ``patchify``: ``[T*Hp*Wp, p*p*C]`` -> ``[C, T, H, W]`` cropped to ``size``."""
    t, hp, wp = grid
    c = tokens.shape[-1] // (p * p)
    x = tokens.reshape(t, hp, wp, p, p, c).permute(5, 0, 1, 3, 2, 4)  # [C, T, Hp, p, Wp, q]
    return x.reshape(c, t, hp * p, wp * p)[:, :, : size[0], : size[1]]


class DomainAwareLinear(nn.Module):
    """One ``[in, out]`` weight (note: not nn.Linear's ``[out, in]``) and bias per embodiment domain."""

    def __init__(self, in_features: int, out_features: int, num_domains: int, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.fc = nn.Embedding(num_domains, in_features * out_features, dtype=dtype)  # [D, in*out]
        self.bias = nn.Embedding(num_domains, out_features, dtype=dtype)  # [D, out]
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor, domain_id: torch.Tensor) -> torch.Tensor:
        """``x`` ``[N, in]``, ``domain_id`` ``[N]`` -> ``[N, out]``."""
        weight = self.fc(domain_id).view(-1, self.in_features, self.out_features)  # [N, in, out]
        return torch.bmm(x.unsqueeze(1), weight).squeeze(1) + self.bias(domain_id)
