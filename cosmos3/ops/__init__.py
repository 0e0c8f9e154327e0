"""The ``torch.ops.cosmos3`` ops: schemas, wrappers, argument checks, fake (meta) impls, and which impl runs where.

    silu_and_mul_2in(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0) -> Tensor
        out = g' * sigmoid(alpha * g') * (u' + beta), g' = min(g, limit), u' = clamp(u, -limit, limit) when
        limit is given; fp32 maths; out in the input dtype, or FP8 e4m3 saturate(out * fp32(1 / scale)) with
        a scale (which differs from out / scale in ~1e-7 of FP8 results, by one step at a rounding tie).
    quantize_fp8(x, scale) -> Tensor
        static per-tensor quantization: saturate(x / scale) in FP8 e4m3.
    dequantize_fp8(weight, scale, dtype) -> Tensor
        W8A16's weight dequantization: (weight * scale) of an FP8 e4m3 weight in fp32, rounded once to dtype
        (bf16 or fp16).
    rms_norm(x, weight, eps, scale=None) -> Tensor
        RMSNorm over the last dim in fp32, rounded once to x's dtype; with a scale, that value
        quantized as quantize_fp8 does, in the same kernel.
    add_rms_norm(x, delta, weight, eps, scale=None) -> (Tensor, Tensor)
        (x + delta rounded to x's dtype, rms_norm of that sum): a residual add and the next norm in one kernel.
    attention_inputs(q, k, v, q_weight, k_weight, eps, cos, sin, k_prefix, v_prefix) -> (Tensor, Tensor, Tensor)
        an attention layer's inputs in one kernel: the QK norm of every head of q [tokens, heads, head_dim] and
        k [tokens, kv_heads, head_dim] (head_dim even), each then rotated by rotate-half RoPE with the tables
        [tokens, head_dim] of cosmos3.layers.rope (the sign folded into sin); k and v [tokens, kv_heads, head_dim]
        written after k_prefix and v_prefix [prefix, kv_heads, head_dim] (a GEN layer's UND K/V; prefix 0 for
        the UND tower). Out: q [tokens, heads, head_dim], k and v [prefix + tokens, kv_heads, head_dim],
        contiguous. q's, k's and v's heads must be contiguous; their tokens may be strided (a fused QKV's
        slices). csrc/rms_norm.cu states the arithmetic and the fixed order of its sums.

Inputs are bf16, fp16 or fp32 (dequantize_fp8's weight: FP8 e4m3), contiguous (but attention_inputs' q, k, v),
of any rank (attention_inputs': 3); a norm's weight and tables have its input's dtype; ``scale`` is an
fp32 tensor with one element on the input's device (read by the kernel, never on the host, so CUDA graphs see
in-place updates).

Registration. The schemas are defined in ``cosmos3.ops.schemas``; every op's impls are registered here on its
``torch.library.Library`` (``define``/``impl``, which cost less a call than ``torch.library.custom_op``'s Python
wrapper; vLLM registers its ops the same way), so the ops exist on a machine without CUDA: the fake impl (output
shape and dtype), the CPU impl (``cosmos3.ops.cpu``: the kernels' arithmetic, bit for bit) and the CUDA impl, which
loads the compiled library on its first call (``cosmos3.ops.loader.load_cuda_ops``, prebuilt or JIT-built) and calls
the op's kernel there, registered by csrc/torch_bindings.cpp under the private namespace ``_cosmos3_cuda``. Each
runs the op's one check first (``cosmos3.ops.checks``), so a bad call raises the same error on every device.
"""

from __future__ import annotations

import inspect

import torch

from cosmos3.ops import checks, cpu, loader
from cosmos3.ops.checks import DEQUANTIZE_DTYPES, INPUT_DTYPES
from cosmos3.ops.cpu import FP8, FP8_MAX
from cosmos3.ops.loader import load_cuda_ops
from cosmos3.ops.schemas import LIB as _LIB
from cosmos3.ops.schemas import NAMES

__all__ = ["DEQUANTIZE_DTYPES", "FP8", "FP8_MAX", "INPUT_DTYPES", "add_rms_norm", "attention_inputs", "dequantize_fp8",
           "load_cuda_ops", "quantize_fp8", "rms_norm", "silu_and_mul_2in"]



def silu_and_mul_2in(gate: torch.Tensor, up: torch.Tensor, *, scale: torch.Tensor | None = None,
                     limit: float | None = None, alpha: float = 1.0, beta: float = 0.0) -> torch.Tensor:
    """SwiGLU of separate gate and up tensors ([...] each), in their dtype or FP8 when ``scale`` is given."""
    return torch.ops.cosmos3.silu_and_mul_2in.default(gate, up, scale, limit, alpha, beta)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor FP8 e4m3 quantization of ``x`` ([...]) with an fp32 one-element ``scale``."""
    return torch.ops.cosmos3.quantize_fp8.default(x, scale)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An FP8 e4m3 ``weight`` ([...]) times its fp32 one-element ``scale``, in ``dtype`` ([...], bf16 or fp16)."""
    return torch.ops.cosmos3.dequantize_fp8.default(weight, scale, dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, scale: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of ``x`` ([..., dim]) times ``weight`` ([dim]), in x's dtype, or FP8 e4m3 with ``scale``."""
    return torch.ops.cosmos3.rms_norm.default(x, weight, eps, scale)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, rms_norm(x + delta))`` of [..., dim] tensors: the residual stream and the next norm's input."""
    return torch.ops.cosmos3.add_rms_norm.default(x, delta, weight, eps, scale)


def attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor,
                     v_prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RoPE of the RMSNorm of each head of ``q`` [tokens, heads, head_dim] and ``k`` [tokens, kv_heads, head_dim]
    (``cos``/``sin`` [tokens, head_dim]), k and ``v`` after ``k_prefix``/``v_prefix`` [prefix, kv_heads, head_dim]:
    q [tokens, heads, head_dim], k and v [prefix + tokens, kv_heads, head_dim]."""
    return torch.ops.cosmos3.attention_inputs.default(q, k, v, q_weight, k_weight, eps, cos, sin, k_prefix, v_prefix)


# --- fake impls: output shape and dtype only ---

def _silu_and_mul_2in_fake(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0):
    return gate.new_empty(gate.shape, dtype=FP8 if scale is not None else gate.dtype)


def _quantize_fp8_fake(x, scale):
    return x.new_empty(x.shape, dtype=FP8)


def _dequantize_fp8_fake(weight, scale, dtype):
    return weight.new_empty(weight.shape, dtype=dtype)


def _rms_norm_fake(x, weight, eps, scale=None):
    return x.new_empty(x.shape, dtype=FP8 if scale is not None else x.dtype)


def _add_rms_norm_fake(x, delta, weight, eps, scale=None):
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=FP8 if scale is not None else x.dtype)


def _attention_inputs_fake(q, k, v, q_weight, k_weight, eps, cos, sin, k_prefix, v_prefix):
    kv_shape = (k_prefix.shape[0] + k.shape[0], *k.shape[1:])
    return q.new_empty(q.shape), k.new_empty(kv_shape), v.new_empty(kv_shape)


# --- CPU impls: computed by cosmos3.ops.cpu ---

def _add_rms_norm_cpu(x, delta, weight, eps, scale=None):
    total = cpu.residual_sum(x, delta)
    return total, cpu.rms_norm(total, weight, eps, scale)


_CPU = {"silu_and_mul_2in": cpu.silu_and_mul_2in, "quantize_fp8": cpu.quantize_fp8,
        "dequantize_fp8": cpu.dequantize_fp8, "rms_norm": cpu.rms_norm, "add_rms_norm": _add_rms_norm_cpu,
        "attention_inputs": cpu.attention_inputs}
_FAKE = {"silu_and_mul_2in": _silu_and_mul_2in_fake, "quantize_fp8": _quantize_fp8_fake,
         "dequantize_fp8": _dequantize_fp8_fake, "rms_norm": _rms_norm_fake, "add_rms_norm": _add_rms_norm_fake,
         "attention_inputs": _attention_inputs_fake}


# --- CUDA: the kernel of the compiled library, loaded on the first call (prebuilt or JIT-built) ---

def _cuda(name: str):
    kernel = getattr(torch.ops._cosmos3_cuda, name).default

    def impl(*args):
        if not loader.is_loaded():
            load_cuda_ops()
        return kernel(*args)

    return impl


def _checked(check, impl):
    """``impl`` after the op's one check (cosmos3/ops/checks.py): every device raises the same error. The check has
    the op's signature: arguments a call left to their defaults (or named) are filled in from it, in order."""
    params = list(inspect.signature(check).parameters.values())

    def checked(*args, **kwargs):
        args = args + tuple(kwargs.get(p.name, p.default) for p in params[len(args):])
        check(*args)
        return impl(*args)

    return checked


for _name in NAMES:
    _check = checks.BY_OP[_name]
    torch.library.register_fake(f"cosmos3::{_name}", _checked(_check, _FAKE[_name]), lib=_LIB)
    _LIB.impl(_name, _checked(_check, _CPU[_name]), "CPU")
    _LIB.impl(_name, _checked(_check, _cuda(_name)), "CUDA")
