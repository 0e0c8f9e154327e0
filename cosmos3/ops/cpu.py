"""The kernels' arithmetic on the CPU, operation for operation: the CPU impls of ``torch.ops.cosmos3.*``.

The kernels evaluate a fixed sequence of correctly rounded fp32 operations (explicit fmaf, no compiler
contraction, a polynomial 2^x of our own instead of expf, whose last bit differs from the CPU's exp, and a
reciprocal by Newton steps instead of a division, which costs the GPU a slow-path branch per element), and the
functions below run the same sequence with torch ops (fmaf exactly, through fp64), so CPU and CUDA agree bit
for bit on every input (NaN payloads aside). silu_and_mul_2in computes (g' * (u' + beta)) * sigmoid(alpha * g'),
sigmoid = 1 / (1 + exp(-alpha * g')) to within 0.5005 ulp; for FP8 output it multiplies by fp32(1 / scale),
while quantize_fp8 divides by the scale, correctly rounded (its kernel multiplies by the reciprocal and
corrects with one fma: the same bits, see divide() in csrc/vec_fp8.cuh; the swiglu kernel cannot afford that
correction). The fp32 result is within a few ulps of the exact formula (plus |alpha * g| ulps from rounding
the exponent's coefficient); for g < -86.6 / alpha, where the exact value is below 2e-38 * |g * (u + beta)|,
sigmoid is held at 2^-125.5.

The norms (csrc/rms_norm.cu) sum squares by fmaf in the kernel's fixed order: chunk c of 8 elements belongs to
lane c % lanes, each lane adds its chunks in turn, and the lanes combine by halving (shared memory across warps,
the warp's butterfly within one); ``_sum_of_squares`` walks the same order over all rows at once.

Arguments are checked by ``cosmos3.ops`` before they get here.
"""

from __future__ import annotations

import functools
import math

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

# Constants shared with csrc/silu_and_mul_2in.cu (tests/cosmos3/test_ops.py checks they agree).
LOG2E_F32 = float.fromhex("0x1.715476p+0")  # log2(e) rounded to fp32
EXP2_COEFFS = tuple(float.fromhex(c) for c in ("0x1.62e42ap-1", "0x1.ebf9bcp-3", "0x1.c6b754p-5",
                                               "0x1.3cea8ap-7", "0x1.5bb9fep-10"))  # c1..c5
EXP2_MIN, EXP2_MAX = -125.0, 125.0  # the exponent's range: 2^round(t) * p normal, 1 + 2^t <= 2^125.5
RECIP_SEED = 0x7EF311C3  # 1 / d ~= float(RECIP_SEED - bits(d)) within 12% for d in [1, 2^125.5]
NEWTON_STEPS = 3  # each squares the seed's relative error: 0.12 -> 1.4e-2 -> 2.1e-4 -> within 0.5005 ulp


def _f32(x: float) -> float:
    """``x`` rounded to the nearest fp32 (ties to even), as C++'s static_cast<float>."""
    return torch.tensor(x, dtype=torch.float32).item()


def fma_f32(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
    """fmaf(a, b, c) for fp32 ``a``, ``b``, ``c``, correctly rounded. The product is exact in fp64; the sum is
    rounded to odd there (an inexact sum gets an odd last bit), which makes the final rounding to fp32 correct
    (Boldo and Melquiond, "When double rounding is odd", 2005)."""
    s = a.double() * b
    t = s + c
    v = t - s
    err = (s - (t - v)) + (c - v)  # TwoSum: s + c == t + err exactly
    even = (t.view(torch.int64) & 1) == 0
    odd = torch.nextafter(t, torch.where(err > 0, math.inf, -math.inf).to(t))
    return torch.where((err != 0) & even, odd, t).float()


def _gate_bounds(coef: float) -> tuple[float, float]:
    """The fp32 range of g for which EXP2_MIN <= g * coef <= EXP2_MAX (no bound for alpha == 0)."""
    if coef == 0:
        return -math.inf, math.inf
    a, b = _f32(EXP2_MIN / coef), _f32(EXP2_MAX / coef)
    return min(a, b), max(a, b)


def _exp_neg_alpha_g(g: torch.Tensor, alpha: float) -> torch.Tensor:
    """exp(-alpha * g) for fp32 ``g``, as the kernel's exp_neg_alpha_g: 2^n * p(f) with n = round(g * coef),
    f = g * coef - n, coef = fp32(-alpha * log2(e))."""
    coef = _f32(_f32(-alpha) * LOG2E_F32)
    gate_min, gate_max = _gate_bounds(coef)
    # fmax/fmin, like the kernel's fmaxf/fminf, turn a NaN into a bound (the result is NaN anyway).
    g = torch.fmin(torch.fmax(g, g.new_tensor(gate_min)), g.new_tensor(gate_max))
    x = g.double() * coef  # exact, as inside the kernel's fmaf(g, coef, ...)
    n = x.round()  # ties to even, as fmaf(g, coef, 1.5 * 2^23)
    f = (x - n).float()  # x - n is exact in fp64: one rounding, as fmaf(g, coef, -n)
    c1, c2, c3, c4, c5 = EXP2_COEFFS
    p = fma_f32(f, c5, c4)
    for c in (c3, c2, c1, 1.0):
        p = fma_f32(p, f, c)
    # n shifted into the exponent field scales p by 2^n.
    return (p.view(torch.int32) + (n.to(torch.int32) << 23)).view(torch.float32)


def reciprocal(d: torch.Tensor) -> torch.Tensor:
    """1 / d for fp32 ``d`` in [1, 2^125.5], as the kernel's reciprocal: an integer seed, then Newton steps
    r += r * (1 - d * r), each a pair of fmaf."""
    r = (RECIP_SEED - d.view(torch.int32)).view(torch.float32)
    for _ in range(NEWTON_STEPS):
        r = fma_f32(r, fma_f32(-d, r, 1.0), r)
    return r


def _sigmoid(g: torch.Tensor, alpha: float) -> torch.Tensor:
    """sigmoid(alpha * g) for fp32 ``g``, as the kernel: 1 / (1 + exp(-alpha * g))."""
    return reciprocal(_exp_neg_alpha_g(g, alpha) + 1.0)


@functools.lru_cache(maxsize=16)
def _sigmoid_table(dtype: torch.dtype, alpha: float) -> torch.Tensor:
    """sigmoid(alpha * g) for all 65536 values g of a 16-bit dtype, indexed by g's bits as int16 + 32768."""
    every_value = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
    return _sigmoid(every_value.float(), alpha)


def _sigmoid_of_gate(gate: torch.Tensor, alpha: float) -> torch.Tensor:
    """sigmoid(alpha * gate) in fp32; a 16-bit gate reads it from _sigmoid_table (the same bits, far less work)."""
    if gate.dtype == torch.float32:
        return _sigmoid(gate, alpha)
    return _sigmoid_table(gate.dtype, alpha)[gate.view(torch.int16).int() + (1 << 15)]


def _swiglu_f32(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None, limit: float | None,
                alpha: float, beta: float) -> torch.Tensor:
    """silu_and_mul_2in before the output rounding; see SwigluOp in the kernel."""
    g, u = gate.float(), up.float()
    sigmoid = _sigmoid_of_gate(gate, alpha)
    if limit is not None:
        limit32 = _f32(limit)
        sigmoid = torch.where(g > limit32, _sigmoid(g.new_tensor([limit32]), alpha), sigmoid)  # at g' = limit
        g = g.clamp(max=limit32)
        u = u.clamp(-limit32, limit32)
    out = g * (u + _f32(beta)) * sigmoid
    if scale is not None:
        out = out * (1.0 / scale.reshape(()))  # fp32(1 / scale), as the kernel's Divisor.inv
    return out


def _to_fp8(y: torch.Tensor) -> torch.Tensor:
    # Tensor.to() rounds to nearest even but does not saturate (|y| > 464 becomes NaN): clamp first, which is
    # what the kernel's SATFINITE conversion does.
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8)



def silu_and_mul_2in(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None, limit: float | None,
                     alpha: float, beta: float) -> torch.Tensor:
    """gate, up: [...] -> [...] in their dtype, or FP8 with a scale; the CPU impl of cosmos3::silu_and_mul_2in."""
    y = _swiglu_f32(gate, up, scale, limit, alpha, beta)
    return _to_fp8(y) if scale is not None else y.to(gate.dtype)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x: [...] -> [...] FP8 e4m3, saturate(x / scale); the CPU impl of cosmos3::quantize_fp8."""
    return _to_fp8(x.float() / scale.reshape(()))


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight: [...] FP8 e4m3 -> [...] in dtype, weight * scale in fp32 rounded to nearest even into dtype; the
    CPU impl of cosmos3::dequantize_fp8, and W8A16's dequantization off CUDA (any dtype, fp32 included).

    On the CPU this is bit for bit ``weight.to(bf16) * scale`` (its kernels multiply a bf16 tensor by an fp32
    scalar tensor in fp32); CUDA eager torch's form rounds the scale to bf16 first, so the one-rounding form
    (vLLM-Omni's) is stated explicitly: the same bits on every device, and those the CUDA op computes."""
    return (weight.float() * scale.reshape(())).to(dtype)


NORM_CHUNK = 8  # elements a norm kernel's lane handles at once (kChunk in csrc/rms_norm.cu)
NORM_MAX_LANES = 256  # lanes of one row at most (kMaxLanes there)


def norm_lanes(dim: int) -> int:
    """How many lanes (threads) share a row of ``dim`` elements: the power of two >= its chunks, at most 256."""
    lanes = 1
    while lanes < -(-dim // NORM_CHUNK) and lanes < NORM_MAX_LANES:
        lanes *= 2
    return lanes


def _sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """x: fp32 [rows, dim] -> [rows] fp32, the kernel's fmaf chain per lane and halving over lanes."""
    rows, dim = x.shape
    chunks, lanes = -(-dim // NORM_CHUNK), norm_lanes(dim)
    per_lane = -(-chunks // lanes)
    # Missing elements are zeros: fmaf(0, 0, acc) is acc, as a short chunk or a lane with fewer chunks stops.
    padded = x.new_zeros(rows, per_lane * lanes * NORM_CHUNK)
    padded[:, :dim] = x
    by_lane = padded.view(rows, per_lane, lanes, NORM_CHUNK)  # chunk k * lanes + l is lane l's k-th
    acc = x.new_zeros(rows, lanes)
    for k in range(per_lane):
        for i in range(NORM_CHUNK):
            v = by_lane[:, k, :, i]
            acc = fma_f32(v, v, acc)
    while acc.shape[1] > 1:  # lane l + lane l + o, o = lanes / 2 .. 1 (the warp's butterfly adds the same)
        half = acc.shape[1] // 2
        acc = acc[:, :half] + acc[:, half:]
    return acc[:, 0]


def _normalized(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., dim] in a norm's input dtype -> fp32 [..., dim], (x * inv_rms) * weight rounded to x's dtype."""
    dim = x.shape[-1]
    rows = x.float().reshape(-1, dim)
    sumsq = _sum_of_squares(rows)
    # Each fp32 operation correctly rounded, as the kernel's; torch's fp32 sqrt on the CPU is not (it missed by an
    # ulp for 16% of inputs), the fp64 one rounded to fp32 is (53 >= 2 * 24 + 2 bits).
    inv = 1.0 / torch.sqrt((sumsq / dim + _f32(eps)).double()).float()
    out = (rows * inv[:, None]) * weight.float()
    return out.to(x.dtype).float().view(x.shape)


def residual_sum(x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """x + delta in fp32, rounded to x's dtype: add_rms_norm's first output."""
    return (x.float() + delta.float()).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, scale: torch.Tensor | None) -> torch.Tensor:
    """x: [..., dim] -> [..., dim] in x's dtype, or FP8 with a scale; the CPU impl of cosmos3::rms_norm."""
    n = _normalized(x, weight, eps)
    return _to_fp8(n / scale.reshape(())) if scale is not None else n.to(x.dtype)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                  sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, dim] -> [tokens, heads, dim]: fmaf(roll(n, dim / 2), sin, n * cos) in x's dtype, n the
    rounded RMSNorm of each head; what cosmos3::attention_inputs computes of q and of k."""
    n = _normalized(x.contiguous(), weight, eps)
    rolled = n.roll(x.shape[-1] // 2, dims=-1)
    return fma_f32(rolled, sin.float()[:, None], n * cos.float()[:, None]).to(x.dtype)


def attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor,
                     v_prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q: [tokens, heads, dim], k, v: [tokens, kv_heads, dim], prefixes [prefix, kv_heads, dim] -> q's and k's
    rms_norm_rope, k's after k_prefix, v after v_prefix; the CPU impl of cosmos3::attention_inputs."""
    return (rms_norm_rope(q, q_weight, eps, cos, sin), torch.cat([k_prefix, rms_norm_rope(k, k_weight, eps, cos, sin)]),
            torch.cat([v_prefix, v]))
