"""MoT joint attention: UND causal over text; GEN queries over ``[K_und ; K_gen]``.

Attribute names are the checkpoint's: ``to_q/to_k/to_v/to_out`` + ``norm_q/norm_k`` are the
UND tower, ``add_q_proj/add_k_proj/add_v_proj/to_add_out`` + ``norm_added_q/norm_added_k`` the
GEN tower. BF16 and dynamic FP8 fuse each tower's Q/K/V into one Linear (``to_qkv`` /
``add_qkv_proj``); static FP8 keeps them split, quantizes their shared input once, and at few tokens runs
them as one GEMM over their packed weights (cosmos3/layers/packed.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from cosmos3 import ops
from cosmos3.layers.attention_kernels import AttentionKernels
from cosmos3.layers.linear import Linear, quantize_shared_input, shared_input_scale, validate_shared_input_scales
from cosmos3.layers.norm import RMSNorm
from cosmos3.layers.packed import PackedProjections

# make_linear(checkpoint_name, in_features, out_features, shard_keys) -> Linear
LinearFactory = Callable[..., Linear]


@dataclass(frozen=True)
class Tower:
    """Checkpoint names of one tower's attention parameters."""

    q: str
    k: str
    v: str
    out: str
    norm_q: str
    norm_k: str
    fused_qkv: str


UND = Tower("to_q", "to_k", "to_v", "to_out", "norm_q", "norm_k", fused_qkv="to_qkv")
GEN = Tower("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "norm_added_q", "norm_added_k", "add_qkv_proj")


class MoTAttention(nn.Module):
    def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                 split_qkv: bool, make_linear: LinearFactory, dtype: torch.dtype, kernels: AttentionKernels):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.eps = eps  # both QK norms' (attention_inputs takes one)
        self.split_qkv = split_qkv
        self.kernels = kernels  # shared by every layer of the model: the attention choice lives there
        q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
        for tower in (UND, GEN):
            if split_qkv:
                for name, width in ((tower.q, q_dim), (tower.k, kv_dim), (tower.v, kv_dim)):
                    setattr(self, name, make_linear(name, hidden_size, width))
            else:
                fused = make_linear(tower.fused_qkv, hidden_size, (q_dim, kv_dim, kv_dim),
                                    shard_keys=(tower.q, tower.k, tower.v))
                setattr(self, tower.fused_qkv, fused)
            setattr(self, tower.out, make_linear(tower.out, q_dim, hidden_size))
            setattr(self, tower.norm_q, RMSNorm(head_dim, eps, dtype))
            setattr(self, tower.norm_k, RMSNorm(head_dim, eps, dtype))
        # tower.q -> the tower's Q/K/V packed into one weight buffer (None unless all three are static FP8)
        self.packed = {tower.q: PackedProjections.of(self._projections(tower)) for tower in (UND, GEN)} \
            if split_qkv else {}

    def _projections(self, tower: Tower) -> list[Linear]:
        return [getattr(self, name) for name in (tower.q, tower.k, tower.v)]

    def input_scale(self, tower: Tower) -> torch.Tensor | None:
        """The FP8 scale the norm before ``tower``'s QKV should quantize with (None: 16-bit input)."""
        return shared_input_scale(self._projections(tower)) if self.split_qkv else None

    def _qkv(self, tower: Tower, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor,
             v_prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[S, H]`` (FP8 when ``input_scale`` says so) and the K/V before this tower's ``[P, nkv, hd]`` -> q
        ``[S, nh, hd]``, k/v ``[P + S, nkv, hd]``: QK RMSNorm per head, RoPE (q, k) and k/v after the prefixes,
        one kernel."""
        if self.split_qkv:
            projections = self._projections(tower)
            x_in = quantize_shared_input(x, projections)  # one FP8 tensor for Q, K and V on W8A8 steps
            packed = self.packed[tower.q]
            if packed is not None and packed.wants(x_in):
                q, k, v = packed(x_in)  # column slices of one GEMM's [S, q_dim + 2 * kv_dim]: strided tokens
            else:
                q, k, v = (proj(x_in) for proj in projections)
        else:
            fused = getattr(self, tower.fused_qkv)
            q, k, v = fused(x).split(fused.shard_sizes, dim=-1)  # column slices: strided tokens
        heads = (-1, self.num_heads, self.head_dim)
        kv_heads = (-1, self.num_kv_heads, self.head_dim)
        return ops.attention_inputs(q.reshape(heads), k.reshape(kv_heads), v.reshape(kv_heads),
                                    getattr(self, tower.norm_q).weight, getattr(self, tower.norm_k).weight, self.eps,
                                    cos, sin, k_prefix, v_prefix)

    def und(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """UND causal self-attention; returns the output and this layer's K/V for the cache."""
        nothing = self.norm_k.weight.new_empty((0, self.num_kv_heads, self.head_dim))  # UND attends to UND only
        q, k, v = self._qkv(UND, x, cos, sin, nothing, nothing)
        out = self.kernels.und(q, k, v)
        return self.to_out(out), k, v  # k post-norm post-RoPE, v raw: [S_und, nkv, hd]

    def gen(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_und: torch.Tensor, v_und: torch.Tensor,
            skip: torch.Tensor | None = None):
        """GEN queries attend, unmasked, to the UND keys first and then the GEN keys; ``skip`` (int32 [1] on the
        device, or None) leading rows of ``k_und``/``v_und`` are not the prompt's and are skipped."""
        q, k, v = self._qkv(GEN, x, cos, sin, k_und, v_und)  # k, v: [S_und + S_gen, nkv, hd]
        return self.to_add_out(self.kernels.gen(q, k, v, skip))

    def finish_loading(self, where: str) -> None:
        """Checks the loaded scales; makes the packed groups' column scales from them."""
        if self.split_qkv:
            for tower in (UND, GEN):
                group = dict(zip((tower.q, tower.k, tower.v), self._projections(tower), strict=True))
                validate_shared_input_scales(group, where)
        for packed in self.packed.values():
            if packed is not None:
                packed.refresh()

