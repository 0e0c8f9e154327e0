"""Attention inputs that look like a trained GEN layer's, at the Nano shapes: hidden states with a shared offset (the
common component real hidden states carry) through random projections, per-head RMSNorm with log-normal weights
(median 1.35, so logits spread as in a trained model instead of staying near zero), then the model's mRoPE on the
clip's token grid (text positions for the UND keys). benchmarks/bench_attention.py times the kernels on them;
tests/cosmos3/test_attention_kernels.py bounds the FP8 kernels' error on them."""

from __future__ import annotations

import torch

from cosmos3 import ops
from cosmos3.layers.rope import MRoPE, grid_positions, text_positions

GRIDS = {1024: (1, 32, 32), 44160: (48, 23, 40)}  # patch grid (T, Hp, Wp) of each GEN token count
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, TEXT = 32, 8, 128, 4096, 512
ERROR_ROWS = 256


def realistic_qkv(n_gen: int, seed: int = 0):
    """q ``[n_gen, 32, 128]``, k/v ``[512 + n_gen, 8, 128]`` bf16 on CUDA, as a GEN layer produces them."""
    g = torch.Generator("cuda").manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, device="cuda") * std

    offset = randn(HIDDEN, std=2.0)  # shared by every token
    rope = MRoPE(HEAD_DIM, 5e6, (24, 20, 20)).cuda()
    t, hp, wp = GRIDS[n_gen]
    positions = [text_positions(TEXT), grid_positions((t, hp, wp), TEXT + 15000, fps=24.0 if t > 1 else None,
                                                      base_fps=24.0, temporal_compression=4)]
    k = v = torch.empty(0, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)  # what UND keys follow
    for tokens, pos in ((TEXT, positions[0]), (n_gen, positions[1])):  # UND, then GEN after UND's K/V
        x = (randn(tokens, HIDDEN) + offset).bfloat16()
        cos, sin = rope(pos, torch.bfloat16)
        q_new, k_new, v_new = (x @ randn(HIDDEN, heads * HEAD_DIM, std=HIDDEN**-0.5).bfloat16()
                               for heads in (HEADS, KV_HEADS, KV_HEADS))
        q_weight, k_weight = (torch.exp(randn(HEAD_DIM, std=0.5) + 0.3).bfloat16() for _ in range(2))
        q, k, v = ops.attention_inputs(q_new.view(tokens, HEADS, HEAD_DIM), k_new.view(tokens, KV_HEADS, HEAD_DIM),
                                       v_new.view(tokens, KV_HEADS, HEAD_DIM), q_weight, k_weight, 1e-6, cos, sin, k, v)
    return q, k, v
