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

Registration. The schemas are defined in ``cosmos3.ops.schemas``; CPU impls and fake impls are registered here on
its ``torch.library.Library`` (``define``/``impl``, which cost less a call than ``torch.library.custom_op``'s Python
wrapper; vLLM registers its ops the same way), so the ops exist on a machine without CUDA. The CPU impls are
``cosmos3.ops.cpu``: the kernels' arithmetic, bit for bit. The CUDA kernels are registered by
csrc/torch_bindings.cpp (``TORCH_LIBRARY_IMPL(cosmos3, CUDA, m)``) once ``cosmos3.ops.loader.load_cuda_ops`` has
loaded the library (prebuilt or JIT-built). Until then a CUDA call falls through to a CompositeExplicitAutograd
kernel registered here that loads the library and calls the op again; a backend (CUDA) kernel takes precedence over
CompositeExplicitAutograd, so afterwards every call goes straight to C++.
"""

from __future__ import annotations

import torch

from cosmos3.ops import cpu, loader
from cosmos3.ops.cpu import FP8, FP8_MAX
from cosmos3.ops.loader import load_cuda_ops
from cosmos3.ops.schemas import LIB as _LIB

__all__ = ["DEQUANTIZE_DTYPES", "FP8", "FP8_MAX", "INPUT_DTYPES", "add_rms_norm", "attention_inputs", "dequantize_fp8",
           "load_cuda_ops", "quantize_fp8", "rms_norm", "silu_and_mul_2in"]

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEQUANTIZE_DTYPES = (torch.bfloat16, torch.float16)  # dequantize_fp8's outputs: a W8A16 GEMM's 16-bit operand


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


# --- argument checks (csrc/torch_bindings.cpp applies the same rules, in the same order and words) ---

def _check_input_dtype(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in INPUT_DTYPES:
        raise ValueError(f"{op}: {name} must be bfloat16, float16 or float32, got {t.dtype}")


def _check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous, got strides {list(t.stride())} for shape "
                         f"{list(t.shape)}; call .contiguous() first")


def _check_scale(op: str, scale: torch.Tensor, x: torch.Tensor) -> None:
    if scale.dtype != torch.float32:
        raise ValueError(f"{op}: scale must be float32, got {scale.dtype}; pass scale.float()")
    if scale.numel() != 1:
        raise ValueError(f"{op}: scale must have exactly one element, got shape {list(scale.shape)}; pass one "
                         "per-tensor scale, shape [1] or []")
    if scale.device != x.device:
        raise ValueError(f"{op}: scale must be on the input's device {x.device}, got {scale.device}; move it there "
                         "with .to()")


def _check_swiglu_args(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None,
                       limit: float | None) -> None:
    op = "silu_and_mul_2in"
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate and up must have the same shape, got {list(gate.shape)} and {list(up.shape)}")
    if gate.dtype != up.dtype:
        raise ValueError(f"{op}: gate and up must have the same dtype, got {gate.dtype} and {up.dtype}")
    if gate.device != up.device:
        raise ValueError(f"{op}: gate and up must be on the same device, got {gate.device} and {up.device}")
    _check_input_dtype(op, "gate", gate)
    _check_contiguous(op, "gate", gate)
    _check_contiguous(op, "up", up)
    if scale is not None:
        _check_scale(op, scale, gate)
    if limit is not None and not limit > 0:
        raise ValueError(f"{op}: limit must be positive, got {limit}")


def _check_quantize_args(x: torch.Tensor, scale: torch.Tensor) -> None:
    _check_input_dtype("quantize_fp8", "x", x)
    _check_contiguous("quantize_fp8", "x", x)
    _check_scale("quantize_fp8", scale, x)


def _check_dequantize_args(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
    op = "dequantize_fp8"
    if weight.dtype != FP8:
        raise ValueError(f"{op}: weight must be float8_e4m3fn, got {weight.dtype}; pass the checkpoint's FP8 weight "
                         "(a 16-bit one needs no dequantization)")
    _check_contiguous(op, "weight", weight)
    _check_scale(op, scale, weight)
    if dtype not in DEQUANTIZE_DTYPES:
        raise ValueError(f"{op}: dtype must be bfloat16 or float16, got {dtype}; pass the 16-bit dtype of the "
                         "activations the weight multiplies")


def _check_norm_weight(op: str, name: str, weight: torch.Tensor, x_name: str, x: torch.Tensor, dim: int) -> None:
    """A norm's weight (named ``name``) of the input ``x_name``, whose last dim is ``dim``."""
    if weight.dtype != x.dtype:
        raise ValueError(f"{op}: {name} must have {x_name}'s dtype {x.dtype}, got {weight.dtype}")
    if list(weight.shape) != [dim]:
        raise ValueError(f"{op}: {name} must have shape [{dim}] ({x_name}'s last dim), got {list(weight.shape)}")
    _check_contiguous(op, name, weight)
    if weight.device != x.device:
        raise ValueError(f"{op}: {name} must be on {x_name}'s device {x.device}, got {weight.device}")


def _check_norm_args(op: str, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     scale: torch.Tensor | None) -> None:
    _check_input_dtype(op, "x", x)
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype or delta.device != x.device):
        raise ValueError(f"{op}: delta must match x (shape {list(x.shape)}, {x.dtype}, {x.device}), got shape "
                         f"{list(delta.shape)}, {delta.dtype}, {delta.device}")
    _check_contiguous(op, "x", x)
    if delta is not None:
        _check_contiguous(op, "delta", delta)
    dim = x.shape[-1] if x.dim() > 0 else 0
    if dim == 0:
        raise ValueError(f"{op}: x needs a non-empty last dim to normalize, got shape {list(x.shape)}")
    _check_norm_weight(op, "weight", weight, "x", x, dim)
    if scale is not None:
        _check_scale(op, scale, x)


def _check_attention_inputs_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                                 k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                 k_prefix: torch.Tensor, v_prefix: torch.Tensor) -> None:
    op = "attention_inputs"
    _check_input_dtype(op, "q", q)
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be [tokens, heads, head_dim], got shape {list(q.shape)}")
    tokens, _, dim = q.shape
    if dim == 0 or dim % 2 != 0:
        raise ValueError(f"{op}: head_dim must be positive and even (RoPE rotates pairs), got {dim}")
    for name, t in (("k", k), ("v", v)):
        if (t.dtype != q.dtype or t.dim() != 3 or t.shape[0] != tokens or t.shape[2] != dim
                or t.device != q.device):
            raise ValueError(f"{op}: {name} must be [{tokens}, kv_heads, {dim}] {q.dtype} on {q.device} (q's tokens, "
                             f"head_dim, dtype and device), got {list(t.shape)} {t.dtype} on {t.device}")
    kv_heads = k.shape[1]
    if v.shape[1] != kv_heads:
        raise ValueError(f"{op}: v must have k's {kv_heads} heads, got {v.shape[1]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(2) != 1 or t.stride(1) != dim:
            raise ValueError(f"{op}: each token's heads of {name} must be contiguous (strides [*, {dim}, 1]), got "
                             f"strides {list(t.stride())}; call .contiguous() first")
    _check_norm_weight(op, "q_weight", q_weight, "q", q, dim)
    _check_norm_weight(op, "k_weight", k_weight, "k", k, dim)
    for name, table in (("cos", cos), ("sin", sin)):
        if table.dtype != q.dtype or list(table.shape) != [tokens, dim] or table.device != q.device:
            raise ValueError(f"{op}: {name} must be [{tokens}, {dim}] {q.dtype} on {q.device}, got "
                             f"{list(table.shape)} {table.dtype} on {table.device}")
        _check_contiguous(op, name, table)
    for name, t in (("k_prefix", k_prefix), ("v_prefix", v_prefix)):
        if t.dtype != q.dtype or t.dim() != 3 or list(t.shape[1:]) != [kv_heads, dim] or t.device != q.device:
            raise ValueError(f"{op}: {name} must be [prefix, {kv_heads}, {dim}] {q.dtype} on {q.device}, got "
                             f"{list(t.shape)} {t.dtype} on {t.device}")
        _check_contiguous(op, name, t)
    if v_prefix.shape[0] != k_prefix.shape[0]:
        raise ValueError(f"{op}: v_prefix must have k_prefix's {k_prefix.shape[0]} tokens, got {v_prefix.shape[0]}")


# --- fake impls: output shape and dtype only ---

def _silu_and_mul_2in_fake(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0):
    _check_swiglu_args(gate, up, scale, limit)
    return gate.new_empty(gate.shape, dtype=FP8 if scale is not None else gate.dtype)


def _quantize_fp8_fake(x, scale):
    _check_quantize_args(x, scale)
    return x.new_empty(x.shape, dtype=FP8)


def _dequantize_fp8_fake(weight, scale, dtype):
    _check_dequantize_args(weight, scale, dtype)
    return weight.new_empty(weight.shape, dtype=dtype)


def _rms_norm_fake(x, weight, eps, scale=None):
    _check_norm_args("rms_norm", x, None, weight, scale)
    return x.new_empty(x.shape, dtype=FP8 if scale is not None else x.dtype)


def _add_rms_norm_fake(x, delta, weight, eps, scale=None):
    _check_norm_args("add_rms_norm", x, delta, weight, scale)
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=FP8 if scale is not None else x.dtype)


def _attention_inputs_fake(q, k, v, q_weight, k_weight, eps, cos, sin, k_prefix, v_prefix):
    _check_attention_inputs_args(q, k, v, q_weight, k_weight, cos, sin, k_prefix, v_prefix)
    kv_shape = (k_prefix.shape[0] + k.shape[0], *k.shape[1:])
    return q.new_empty(q.shape), k.new_empty(kv_shape), v.new_empty(kv_shape)


# --- CPU impls: checked here, computed by cosmos3.ops.cpu ---

def _silu_and_mul_2in_cpu(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0):
    _check_swiglu_args(gate, up, scale, limit)
    return cpu.silu_and_mul_2in(gate, up, scale, limit, alpha, beta)


def _quantize_fp8_cpu(x, scale):
    _check_quantize_args(x, scale)
    return cpu.quantize_fp8(x, scale)


def _dequantize_fp8_cpu(weight, scale, dtype):
    _check_dequantize_args(weight, scale, dtype)
    return cpu.dequantize_fp8(weight, scale, dtype)


def _rms_norm_cpu(x, weight, eps, scale=None):
    _check_norm_args("rms_norm", x, None, weight, scale)
    return cpu.rms_norm(x, weight, eps, scale)


def _add_rms_norm_cpu(x, delta, weight, eps, scale=None):
    _check_norm_args("add_rms_norm", x, delta, weight, scale)
    total = cpu.residual_sum(x, delta)
    return total, cpu.rms_norm(total, weight, eps, scale)


def _attention_inputs_cpu(q, k, v, q_weight, k_weight, eps, cos, sin, k_prefix, v_prefix):
    _check_attention_inputs_args(q, k, v, q_weight, k_weight, cos, sin, k_prefix, v_prefix)
    return cpu.attention_inputs(q, k, v, q_weight, k_weight, eps, cos, sin, k_prefix, v_prefix)


def _load_then_redispatch(op_name: str):
    """The CompositeExplicitAutograd kernel of an op: reached by CUDA tensors only until the CUDA kernels load."""
    def impl(*args):
        device = args[0].device
        if device.type != "cuda":
            raise NotImplementedError(f"cosmos3::{op_name} runs on CPU and CUDA tensors, got {device}")
        if loader.is_loaded():
            raise RuntimeError(f"cosmos3::{op_name}: the CUDA extension is loaded but has no kernel for this op")
        load_cuda_ops()
        return getattr(torch.ops.cosmos3, op_name).default(*args)
    return impl


for _name, _fake, _cpu in (("silu_and_mul_2in", _silu_and_mul_2in_fake, _silu_and_mul_2in_cpu),
                           ("quantize_fp8", _quantize_fp8_fake, _quantize_fp8_cpu),
                           ("dequantize_fp8", _dequantize_fp8_fake, _dequantize_fp8_cpu),
                           ("rms_norm", _rms_norm_fake, _rms_norm_cpu),
                           ("add_rms_norm", _add_rms_norm_fake, _add_rms_norm_cpu),
                           ("attention_inputs", _attention_inputs_fake, _attention_inputs_cpu)):
    torch.library.register_fake(f"cosmos3::{_name}", _fake, lib=_LIB)
    _LIB.impl(_name, _cpu, "CPU")
    _LIB.impl(_name, _load_then_redispatch(_name), "CompositeExplicitAutograd")
