"""The argument rules of every ``torch.ops.cosmos3`` op, written once: the fake impls (torch.compile's tracing),
the CPU impls and the CUDA entry (before it calls the kernel) all run these, so a bad call raises the same
ValueError, in the same words, on every device. Python is the one side every device reaches: a CPU machine has no
compiled library, and a fake tensor never reaches C++."""

from __future__ import annotations

import torch

from cosmos3.ops.cpu import FP8

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEQUANTIZE_DTYPES = (torch.bfloat16, torch.float16)  # dequantize_fp8's outputs: a W8A16 GEMM's 16-bit operand


def check_input_dtype(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in INPUT_DTYPES:
        raise ValueError(f"{op}: {name} must be bfloat16, float16 or float32, got {t.dtype}")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous, got strides {list(t.stride())} for shape "
                         f"{list(t.shape)}; call .contiguous() first")


def check_scale(op: str, scale: torch.Tensor, x: torch.Tensor) -> None:
    if scale.dtype != torch.float32:
        raise ValueError(f"{op}: scale must be float32, got {scale.dtype}; pass scale.float()")
    if scale.numel() != 1:
        raise ValueError(f"{op}: scale must have exactly one element, got shape {list(scale.shape)}; pass one "
                         "per-tensor scale, shape [1] or []")
    if scale.device != x.device:
        raise ValueError(f"{op}: scale must be on the input's device {x.device}, got {scale.device}; move it there "
                         "with .to()")


def check_swiglu_args(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None,
                       limit: float | None) -> None:
    op = "silu_and_mul_2in"
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate and up must have the same shape, got {list(gate.shape)} and {list(up.shape)}")
    if gate.dtype != up.dtype:
        raise ValueError(f"{op}: gate and up must have the same dtype, got {gate.dtype} and {up.dtype}")
    if gate.device != up.device:
        raise ValueError(f"{op}: gate and up must be on the same device, got {gate.device} and {up.device}")
    check_input_dtype(op, "gate", gate)
    check_contiguous(op, "gate", gate)
    check_contiguous(op, "up", up)
    if scale is not None:
        check_scale(op, scale, gate)
    if limit is not None and not limit > 0:
        raise ValueError(f"{op}: limit must be positive, got {limit}")


def check_quantize_args(x: torch.Tensor, scale: torch.Tensor) -> None:
    check_input_dtype("quantize_fp8", "x", x)
    check_contiguous("quantize_fp8", "x", x)
    check_scale("quantize_fp8", scale, x)


def check_dequantize_args(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
    op = "dequantize_fp8"
    if weight.dtype != FP8:
        raise ValueError(f"{op}: weight must be float8_e4m3fn, got {weight.dtype}; pass the checkpoint's FP8 weight "
                         "(a 16-bit one needs no dequantization)")
    check_contiguous(op, "weight", weight)
    check_scale(op, scale, weight)
    if dtype not in DEQUANTIZE_DTYPES:
        raise ValueError(f"{op}: dtype must be bfloat16 or float16, got {dtype}; pass the 16-bit dtype of the "
                         "activations the weight multiplies")


def check_norm_weight(op: str, name: str, weight: torch.Tensor, x_name: str, x: torch.Tensor, dim: int) -> None:
    """A norm's weight (named ``name``) of the input ``x_name``, whose last dim is ``dim``."""
    if weight.dtype != x.dtype:
        raise ValueError(f"{op}: {name} must have {x_name}'s dtype {x.dtype}, got {weight.dtype}")
    if list(weight.shape) != [dim]:
        raise ValueError(f"{op}: {name} must have shape [{dim}] ({x_name}'s last dim), got {list(weight.shape)}")
    check_contiguous(op, name, weight)
    if weight.device != x.device:
        raise ValueError(f"{op}: {name} must be on {x_name}'s device {x.device}, got {weight.device}")


def check_norm_args(op: str, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     scale: torch.Tensor | None) -> None:
    check_input_dtype(op, "x", x)
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype or delta.device != x.device):
        raise ValueError(f"{op}: delta must match x (shape {list(x.shape)}, {x.dtype}, {x.device}), got shape "
                         f"{list(delta.shape)}, {delta.dtype}, {delta.device}")
    check_contiguous(op, "x", x)
    if delta is not None:
        check_contiguous(op, "delta", delta)
    dim = x.shape[-1] if x.dim() > 0 else 0
    if dim == 0:
        raise ValueError(f"{op}: x needs a non-empty last dim to normalize, got shape {list(x.shape)}")
    check_norm_weight(op, "weight", weight, "x", x, dim)
    if scale is not None:
        check_scale(op, scale, x)


def check_attention_inputs_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                                 k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                 k_prefix: torch.Tensor, v_prefix: torch.Tensor) -> None:
    op = "attention_inputs"
    check_input_dtype(op, "q", q)
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
    check_norm_weight(op, "q_weight", q_weight, "q", q, dim)
    check_norm_weight(op, "k_weight", k_weight, "k", k, dim)
    for name, table in (("cos", cos), ("sin", sin)):
        if table.dtype != q.dtype or list(table.shape) != [tokens, dim] or table.device != q.device:
            raise ValueError(f"{op}: {name} must be [{tokens}, {dim}] {q.dtype} on {q.device}, got "
                             f"{list(table.shape)} {table.dtype} on {table.device}")
        check_contiguous(op, name, table)
    for name, t in (("k_prefix", k_prefix), ("v_prefix", v_prefix)):
        if t.dtype != q.dtype or t.dim() != 3 or list(t.shape[1:]) != [kv_heads, dim] or t.device != q.device:
            raise ValueError(f"{op}: {name} must be [prefix, {kv_heads}, {dim}] {q.dtype} on {q.device}, got "
                             f"{list(t.shape)} {t.dtype} on {t.device}")
        check_contiguous(op, name, t)
    if v_prefix.shape[0] != k_prefix.shape[0]:
        raise ValueError(f"{op}: v_prefix must have k_prefix's {k_prefix.shape[0]} tokens, got {v_prefix.shape[0]}")




# --- each op's check, with the op's own signature (cosmos3/ops/schemas.py) ---

def check_silu_and_mul_2in(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0) -> None:
    check_swiglu_args(gate, up, scale, limit)


def check_quantize_fp8(x, scale) -> None:
    check_quantize_args(x, scale)


def check_dequantize_fp8(weight, scale, dtype) -> None:
    check_dequantize_args(weight, scale, dtype)


def check_rms_norm(x, weight, eps, scale=None) -> None:
    check_norm_args("rms_norm", x, None, weight, scale)


def check_add_rms_norm(x, delta, weight, eps, scale=None) -> None:
    check_norm_args("add_rms_norm", x, delta, weight, scale)


def check_attention_inputs(q, k, v, q_weight, k_weight, eps, cos, sin, k_prefix, v_prefix) -> None:
    check_attention_inputs_args(q, k, v, q_weight, k_weight, cos, sin, k_prefix, v_prefix)


BY_OP = {"silu_and_mul_2in": check_silu_and_mul_2in, "quantize_fp8": check_quantize_fp8,
         "dequantize_fp8": check_dequantize_fp8, "rms_norm": check_rms_norm, "add_rms_norm": check_add_rms_norm,
         "attention_inputs": check_attention_inputs}
