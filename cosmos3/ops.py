"""The Python face of csrc/: the ``torch.ops.cosmos3`` ops, their fake (meta) and CPU impls, the CUDA build.

    silu_and_mul_2in(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0) -> Tensor
        out = g' * sigmoid(alpha * g') * (u' + beta), g' = min(g, limit), u' = clamp(u, -limit, limit) when
        limit is given; fp32 maths; out in the input dtype, or FP8 e4m3 saturate(out * fp32(1 / scale)) with
        a scale (which differs from out / scale in ~1e-7 of FP8 results, by one step at a rounding tie).
    quantize_fp8(x, scale) -> Tensor
        static per-tensor quantization: saturate(x / scale) in FP8 e4m3.

Inputs are bf16, fp16 or fp32, contiguous, of any rank; ``scale`` is an fp32 tensor with one element on the
input's device (read by the kernel, never on the host, so CUDA graphs see in-place updates).

Registration. Schemas, CPU impls and fake impls are registered here with ``torch.library.Library``
(``define``/``impl``: ~3.6 us a call, against ~11 us for ``torch.library.custom_op``; kernels.md section 4), so
the ops exist on a machine without CUDA. The CUDA kernels are registered by csrc/torch_bindings.cpp
(``TORCH_LIBRARY_IMPL(cosmos3, CUDA, m)``) once ``load_cuda_ops`` has built and loaded it. Until then a CUDA
call falls through to a CompositeExplicitAutograd kernel registered here that loads the extension and calls
the op again; a backend (CUDA) kernel takes precedence over CompositeExplicitAutograd, so afterwards every
call goes straight to C++.

Bit-exact CPU impls. The kernels evaluate a fixed sequence of correctly rounded fp32 operations (explicit
fmaf, no compiler contraction, a polynomial 2^x of our own instead of expf, whose last bit differs from the
CPU's exp, and a reciprocal by Newton steps instead of a division, which costs the GPU a slow-path branch per
element), and the CPU impls below run the same sequence with torch ops (fmaf exactly, through fp64), so CPU
and CUDA agree bit for bit on every input (NaN payloads aside). silu_and_mul_2in computes
(g' * (u' + beta)) * sigmoid(alpha * g'), sigmoid = 1 / (1 + exp(-alpha * g')) to within 0.5005 ulp; for FP8
output it multiplies by fp32(1 / scale), while quantize_fp8 divides by the scale, correctly rounded (its
kernel multiplies by the reciprocal and corrects with one fma: the same bits, see divide() in
csrc/vec_fp8.cuh; the swiglu kernel cannot afford that correction). The fp32 result is
within a few ulps of the exact formula (plus |alpha * g| ulps from rounding the exponent's coefficient); for
g < -86.6 / alpha, where the exact value is below 2e-38 * |g * (u + beta)|, sigmoid is held at 2^-125.5.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from pathlib import Path
from types import ModuleType

import structlog
import torch

from cosmos3 import launch_table

log = structlog.get_logger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Constants shared with csrc/silu_and_mul_2in.cu (tests/cosmos3/test_ops.py checks they agree).
LOG2E_F32 = float.fromhex("0x1.715476p+0")  # log2(e) rounded to fp32
EXP2_COEFFS = tuple(float.fromhex(c) for c in ("0x1.62e42ap-1", "0x1.ebf9bcp-3", "0x1.c6b754p-5",
                                               "0x1.3cea8ap-7", "0x1.5bb9fep-10"))  # c1..c5
EXP2_MIN, EXP2_MAX = -125.0, 125.0  # the exponent's range: 2^round(t) * p normal, 1 + 2^t <= 2^125.5
RECIP_SEED = 0x7EF311C3  # 1 / d ~= float(RECIP_SEED - bits(d)) within 12% for d in [1, 2^125.5]
NEWTON_STEPS = 3  # each squares the seed's relative error: 0.12 -> 1.4e-2 -> 2.1e-4 -> within 0.5005 ulp

_CSRC = Path(__file__).resolve().parent.parent / "csrc"

_LIB = torch.library.Library("cosmos3", "FRAGMENT")
_LIB.define("silu_and_mul_2in(Tensor gate, Tensor up, Tensor? scale=None, float? limit=None, float alpha=1.0, "
            "float beta=0.0) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))
_LIB.define("quantize_fp8(Tensor x, Tensor scale) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))


def silu_and_mul_2in(gate: torch.Tensor, up: torch.Tensor, *, scale: torch.Tensor | None = None,
                     limit: float | None = None, alpha: float = 1.0, beta: float = 0.0) -> torch.Tensor:
    """SwiGLU of separate gate and up tensors ([...] each), in their dtype or FP8 when ``scale`` is given."""
    return torch.ops.cosmos3.silu_and_mul_2in.default(gate, up, scale, limit, alpha, beta)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor FP8 e4m3 quantization of ``x`` ([...]) with an fp32 one-element ``scale``."""
    return torch.ops.cosmos3.quantize_fp8.default(x, scale)


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
        raise ValueError(f"{op}: scale must be float32, got {scale.dtype}")
    if scale.numel() != 1:
        raise ValueError(f"{op}: scale must have exactly one element, got shape {list(scale.shape)}")
    if scale.device != x.device:
        raise ValueError(f"{op}: scale must be on the input's device {x.device}, got {scale.device}")


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


# --- fake impls: output shape and dtype only ---

def _silu_and_mul_2in_fake(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0):
    _check_swiglu_args(gate, up, scale, limit)
    return gate.new_empty(gate.shape, dtype=FP8 if scale is not None else gate.dtype)


def _quantize_fp8_fake(x, scale):
    _check_quantize_args(x, scale)
    return x.new_empty(x.shape, dtype=FP8)


# --- CPU impls: the kernels' arithmetic, operation for operation ---

def _f32(x: float) -> float:
    """``x`` rounded to the nearest fp32 (ties to even), as C++'s static_cast<float>."""
    return torch.tensor(x, dtype=torch.float32).item()


def _fma_f32(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
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
    p = _fma_f32(f, c5, c4)
    for c in (c3, c2, c1, 1.0):
        p = _fma_f32(p, f, c)
    # n shifted into the exponent field scales p by 2^n.
    return (p.view(torch.int32) + (n.to(torch.int32) << 23)).view(torch.float32)


def _reciprocal(d: torch.Tensor) -> torch.Tensor:
    """1 / d for fp32 ``d`` in [1, 2^125.5], as the kernel's reciprocal: an integer seed, then Newton steps
    r += r * (1 - d * r), each a pair of fmaf."""
    r = (RECIP_SEED - d.view(torch.int32)).view(torch.float32)
    for _ in range(NEWTON_STEPS):
        r = _fma_f32(r, _fma_f32(-d, r, 1.0), r)
    return r


def _sigmoid(g: torch.Tensor, alpha: float) -> torch.Tensor:
    """sigmoid(alpha * g) for fp32 ``g``, as the kernel: 1 / (1 + exp(-alpha * g))."""
    return _reciprocal(_exp_neg_alpha_g(g, alpha) + 1.0)


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


def _silu_and_mul_2in_cpu(gate, up, scale=None, limit=None, alpha=1.0, beta=0.0):
    _check_swiglu_args(gate, up, scale, limit)
    y = _swiglu_f32(gate, up, scale, limit, alpha, beta)
    return _to_fp8(y) if scale is not None else y.to(gate.dtype)


def _quantize_fp8_cpu(x, scale):
    _check_quantize_args(x, scale)
    return _to_fp8(x.float() / scale.reshape(()))


# --- CUDA: csrc/ built on first use ---

_cuda_ext: ModuleType | None = None
_cuda_ext_lock = threading.Lock()


def load_cuda_ops() -> ModuleType:
    """Builds csrc/ for the visible GPUs (first time only; cached in the build dir), loads it, which registers
    the CUDA kernels, and hands it each device's launch parameters. Safe to call again."""
    global _cuda_ext
    with _cuda_ext_lock:
        if _cuda_ext is None:
            if not torch.cuda.is_available():
                raise RuntimeError("cosmos3 CUDA ops: no CUDA device is visible (torch.cuda.is_available() is False)")
            sms = sorted({sm_version(i) for i in range(torch.cuda.device_count())})
            ext = _build_extension(sms)
            for sm in sms:
                set_launch_params(ext, sm, launch_table.launch_params(sm))
            set_launch_params(ext, 0, launch_table.DEFAULT)  # the kernels' fallback for any other device
            _cuda_ext = ext
    return _cuda_ext


def set_launch_params(ext: ModuleType, sm: int, row: dict[str, launch_table.LaunchParams]) -> None:
    """Sets the launch parameters the CUDA kernels use on SM version ``sm`` (0: any version without a row)."""
    for op, params in row.items():
        ext.set_launch_params(sm, op, params.threads, params.vectors_per_thread)


def sm_version(device: int) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def _require_toolchain() -> None:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home is None or not Path(home, "bin", "nvcc").exists():
        raise RuntimeError(
            f"cosmos3 builds its CUDA kernels (csrc/) on first CUDA use and needs nvcc, which was not found "
            f"(CUDA_HOME={home!r}). Install the CUDA toolkit matching torch's CUDA {torch.version.cuda} and put "
            f"its bin/ on PATH, or set CUDA_HOME.")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("cosmos3 builds its CUDA kernels (csrc/) on first CUDA use and needs ninja: "
                           "pip install ninja")


def _build_extension(sms: list[int]) -> ModuleType:
    from torch.utils import cpp_extension

    _require_toolchain()
    # One cubin per visible arch (sm_90 on H200, sm_100 on B200); naming -gencode ourselves also stops torch
    # from reading TORCH_CUDA_ARCH_LIST.
    gencode = [f"-gencode=arch=compute_{sm},code=sm_{sm}" for sm in sms]
    tag = f"torch{torch.__version__}-cuda{torch.version.cuda}-sm{'-'.join(map(str, sms))}".replace("+", "_")
    build_dir = Path(os.environ.get("COSMOS3_BUILD_DIR", Path.home() / ".cache" / "cosmos3")) / tag
    build_dir.mkdir(parents=True, exist_ok=True)
    log.info("loading cosmos3 CUDA ops (built once, about a minute, then cached)", build_dir=str(build_dir))
    sources = [str(p) for p in sorted(_CSRC.glob("*.cu"))] + [str(_CSRC / "torch_bindings.cpp")]
    return cpp_extension.load(name="cosmos3_cuda_ops", sources=sources, extra_cflags=["-O3"],
                              extra_cuda_cflags=["-O3", *gencode], build_directory=str(build_dir))


def _load_then_redispatch(op_name: str):
    """The CompositeExplicitAutograd kernel of an op: reached by CUDA tensors only until the CUDA kernels load."""
    def impl(*args):
        device = args[0].device
        if device.type != "cuda":
            raise NotImplementedError(f"cosmos3::{op_name} runs on CPU and CUDA tensors, got {device}")
        if _cuda_ext is not None:
            raise RuntimeError(f"cosmos3::{op_name}: the CUDA extension is loaded but has no kernel for this op")
        load_cuda_ops()
        return getattr(torch.ops.cosmos3, op_name).default(*args)
    return impl


for _name, _fake, _cpu in (("silu_and_mul_2in", _silu_and_mul_2in_fake, _silu_and_mul_2in_cpu),
                           ("quantize_fp8", _quantize_fp8_fake, _quantize_fp8_cpu)):
    torch.library.register_fake(f"cosmos3::{_name}", _fake, lib=_LIB)
    _LIB.impl(_name, _cpu, "CPU")
    _LIB.impl(_name, _load_then_redispatch(_name), "CompositeExplicitAutograd")
