"""Interleaved 3D mRoPE (``unified_3d_mrope``) and the position ids of the joint sequence.

Angles are built in fp32 with a broadcast multiply (no matmul, no autocast): bf16 cannot
represent consecutive integers above 256 and vision positions start past 15000.
"""

from __future__ import annotations

import torch
from torch import nn


class MRoPE(nn.Module):
    """Position ids ``[3, S]`` (t, h, w) -> ``cos, signed_sin`` ``[S, head_dim]``.

    Llama-style rotate-half RoPE is ``x * cos + rotate_half(x) * sin``; ``rotate_half(x) * sin`` equals
    ``roll(x, head_dim / 2) * signed_sin`` with the sign folded into the table once per layout, which is the
    form ``cosmos3.ops.attention_inputs`` computes (fused with the QK norm before it).
    """

    def __init__(self, head_dim: int, theta: float, axes_dim: tuple[int, int, int]):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # [hd/2]
        # Frequency j reads the h axis when j % 3 == 1 (within 3*axes_dim[1]), w when j % 3 == 2
        # (within 3*axes_dim[2]); every other frequency, and the tail, reads t.
        j = torch.arange(head_dim // 2)
        axis = torch.zeros_like(j)
        axis[(j % 3 == 1) & (j < 3 * axes_dim[1])] = 1
        axis[(j % 3 == 2) & (j < 3 * axes_dim[2])] = 2
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("axis", axis, persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = position_ids.to(self.inv_freq.device, torch.float32)[self.axis]  # [hd/2, S]
        freqs = (positions * self.inv_freq[:, None]).t()  # [S, hd/2]
        cos = torch.cat((freqs, freqs), dim=-1).cos()  # [S, hd]
        signed_sin = torch.cat((-freqs, freqs), dim=-1).sin()  # sin(-a) = -sin(a), exactly
        return cos.to(dtype), signed_sin.to(dtype)


def text_positions(length: int) -> torch.Tensor:
    """Text token n sits at (n, n, n)."""
    return torch.arange(length, dtype=torch.float32).expand(3, -1)  # [3, S]


def grid_positions(
    grid: tuple[int, int, int],
    offset: float,
    *,
    fps: float | None,
    base_fps: float,
    temporal_compression: int,
) -> torch.Tensor:
    """Positions of a ``(T, H, W)`` token grid in ``thw`` order; ``[3, T*H*W]`` fp32.

    Time starts at ``offset`` (text length + the 15000 modality margin); with fps modulation
    (fps given and T > 1) frame i sits at ``i / (fps/tcf) * (base_fps/tcf) + offset``. Spatial
    ids restart at 0 for each segment (``unified_3d_mrope_reset_spatial_ids``).
    """
    t, h, w = grid
    frames = torch.arange(t, dtype=torch.float32)
    if fps is not None and t > 1:
        t_pos = frames / (fps / temporal_compression) * (base_fps / temporal_compression) + offset
    else:
        t_pos = frames + offset
    t_ids = t_pos[:, None, None].expand(t, h, w)
    h_ids = torch.arange(h, dtype=torch.float32)[None, :, None].expand(t, h, w)
    w_ids = torch.arange(w, dtype=torch.float32)[None, None, :].expand(t, h, w)
    return torch.stack([t_ids.flatten(), h_ids.flatten(), w_ids.flatten()])  # [3, T*H*W]
