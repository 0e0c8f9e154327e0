"""torch.ops.cosmos3: silu_and_mul_2in, quantize_fp8 and dequantize_fp8.

CPU tests (CI): registration (opcheck, torch.compile), argument checks, ranks, limit/alpha/beta, the CPU impl
against an independent numpy formula bit for bit, the launch table. GPU tests (``-m gpu``, on an H200): the
CUDA kernels against the CPU impl bit for bit, torch.compile, CUDA-graph replay, opcheck.
"""

from __future__ import annotations

import re
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.library import opcheck

from cosmos3 import ops
from cosmos3.ops import build as ops_build
from cosmos3.ops import cpu as ops_cpu
from cosmos3.ops import launch_table
from cosmos3.ops import loader as ops_loader

CSRC = ops_build.CSRC  # the installed package's sources
FP8 = torch.float8_e4m3fn
CHUNK = 1 << 22  # elements per CPU-reference call on large GPU shapes: bounded host memory

SWIGLU_KWARGS = [
    pytest.param({}, id="plain"),
    pytest.param({"limit": 7.0}, id="limit"),
    pytest.param({"alpha": 1.702, "beta": 1.0}, id="alpha-beta"),
    pytest.param({"limit": 7.0, "alpha": 1.702, "beta": 1.0}, id="limit-alpha-beta"),
]
INPUT_DTYPES = [
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.float32, id="fp32"),
]
OUTPUTS = [pytest.param(False, id="same-dtype-out"), pytest.param(True, id="fp8-out")]
DEQUANTIZE_DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
# Powers of two and not (where CUDA eager torch's bf16-rounded scale would differ), fp16 overflow (300) and
# subnormal outputs (1e-6).
DEQUANTIZE_SCALES = [1.0, 2.0 ** -7, 0.02, 0.0123456, 3.7, 300.0, 1e-6]
# opcheck of an op with an FP8 input, less test_schema: its mutation check compares the inputs with allclose, which
# torch has for FP8 on no device ("mul_cpu_reduced_float" / "mul_cuda" not implemented for 'Float8_e4m3fn').
OPCHECK_FP8_INPUT = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
RANK_SHAPES = [
    pytest.param((37,), id="rank1"),
    pytest.param((5, 37), id="rank2"),
    pytest.param((2, 3, 37), id="rank3"),
    pytest.param((2, 1, 3, 37), id="rank4"),
]


def _bf16(*shape, device="cpu"):
    return torch.randn(*shape, device=device).to(torch.bfloat16)


def _scale(value=0.02, device="cpu"):
    return torch.tensor([value], device=device)


def _fp8(*shape, device="cpu"):
    return (torch.randn(*shape, device=device) * 50).to(FP8)


def _every_fp8_code() -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8)


# Each builds silu_and_mul_2in's arguments on a device; the message is the rule that must be named.
INVALID_SWIGLU_CALLS = [
    pytest.param(lambda d: {"gate": _bf16(4, 8, device=d), "up": _bf16(4, 9, device=d)},
                 "gate and up must have the same shape", id="shape-mismatch"),
    pytest.param(lambda d: {"gate": _bf16(4, 8, device=d), "up": _bf16(4, 8, device=d).half()},
                 "gate and up must have the same dtype", id="dtype-mismatch"),
    pytest.param(lambda d: {"gate": torch.ones(4, 8, dtype=torch.int32, device=d),
                            "up": torch.ones(4, 8, dtype=torch.int32, device=d)},
                 "gate must be bfloat16, float16 or float32", id="int-inputs"),
    pytest.param(lambda d: {"gate": _bf16(8, 4, device=d).t(), "up": _bf16(8, 4, device=d).t()},
                 "gate must be contiguous", id="transposed-gate"),
    pytest.param(lambda d: {"gate": _bf16(4, 8, device=d), "up": _bf16(4, 16, device=d)[:, ::2]},
                 "up must be contiguous", id="strided-up"),
    pytest.param(lambda d: {"gate": _bf16(4, 8, device=d), "up": _bf16(4, 8, device=d),
                            "scale": _scale(device=d).double()},
                 "scale must be float32", id="scale-float64"),
    pytest.param(lambda d: {"gate": _bf16(4, 8, device=d), "up": _bf16(4, 8, device=d),
                            "scale": torch.tensor([0.02, 0.03], device=d)},
                 "scale must have exactly one element", id="scale-two-elements"),
    pytest.param(lambda d: {"gate": _bf16(4, 8, device=d), "up": _bf16(4, 8, device=d), "limit": 0.0},
                 "limit must be positive", id="limit-zero"),
]
INVALID_QUANTIZE_CALLS = [
    pytest.param(lambda d: {"x": _bf16(8, 4, device=d).t(), "scale": _scale(device=d)},
                 "x must be contiguous", id="transposed-x"),
    pytest.param(lambda d: {"x": torch.ones(4, dtype=torch.int8, device=d), "scale": _scale(device=d)},
                 "x must be bfloat16, float16 or float32", id="int8-x"),
    pytest.param(lambda d: {"x": _bf16(4, device=d), "scale": _scale(device=d).half()},
                 "scale must be float32", id="scale-float16"),
    pytest.param(lambda d: {"x": _bf16(4, device=d), "scale": torch.ones(2, 1, device=d)},
                 "scale must have exactly one element", id="scale-two-elements"),
]
INVALID_DEQUANTIZE_CALLS = [
    pytest.param(lambda d: {"weight": _bf16(4, 8, device=d), "scale": _scale(device=d), "dtype": torch.bfloat16},
                 "weight must be float8_e4m3fn", id="bf16-weight"),
    pytest.param(lambda d: {"weight": _fp8(8, 4, device=d).t(), "scale": _scale(device=d), "dtype": torch.bfloat16},
                 "weight must be contiguous", id="transposed-weight"),
    pytest.param(lambda d: {"weight": _fp8(4, 8, device=d), "scale": _scale(device=d).double(),
                            "dtype": torch.bfloat16},
                 "scale must be float32", id="scale-float64"),
    pytest.param(lambda d: {"weight": _fp8(4, 8, device=d), "scale": torch.ones(4, device=d),
                            "dtype": torch.bfloat16},
                 "scale must have exactly one element", id="scale-four-elements"),
    pytest.param(lambda d: {"weight": _fp8(4, 8, device=d), "scale": _scale(device=d), "dtype": torch.float32},
                 "dtype must be bfloat16 or float16", id="fp32-out"),
]
# Every op's broken rules: (op, arguments built on a device, the rule its message must name).
INVALID_CALLS = [pytest.param(op, *call.values, id=f"{op.__name__}-{call.id}")
                 for op, calls in ((ops.silu_and_mul_2in, INVALID_SWIGLU_CALLS),
                                   (ops.quantize_fp8, INVALID_QUANTIZE_CALLS),
                                   (ops.dequantize_fp8, INVALID_DEQUANTIZE_CALLS))
                 for call in calls]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal dtype, shape and bits; NaNs only need to sit at the same places (their payloads may differ)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    nan = expected.float().isnan()
    assert torch.equal(actual.float().isnan(), nan), "NaNs at different places"
    differ = (_bits(actual) != _bits(expected)) & ~nan
    assert not differ.any(), f"{int(differ.sum())} of {differ.numel()} elements differ"


def _all_16bit_values(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)


def _specials(dtype: torch.dtype) -> torch.Tensor:
    big = torch.finfo(dtype).max
    return torch.tensor([0.0, -0.0, 1.0, -1.0, big, -big, float("inf"), float("-inf"), float("nan"), 1e-30, 88.0,
                         -88.0, 90.0, -90.0, 200.0, -200.0, 464.0, 1e4], dtype=dtype)


# --- an independent numpy formula of the documented arithmetic ---

def _np_fma(a, b, c) -> np.ndarray:
    """Correctly rounded fp32 fma, another way than ops_cpu.fma_f32: in fp64 the product is exact and the sum t
    rounds once; rounding t to fp32 is then right unless t lies exactly halfway between two fp32 values while
    the sum was inexact, and then the sign of the sum's error decides."""
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    s = a * b
    t = s + c
    v = t - s
    err = (s - (t - v)) + (c - v)
    halfway = (t.view(np.int64) & ((1 << 29) - 1)) == (1 << 28)  # the 29 bits below fp32 precision: 100...0
    t = np.where(halfway & (err != 0), np.nextafter(t, np.where(err > 0, np.inf, -np.inf)), t)
    return t.astype(np.float32)


def _np_reciprocal(d: np.ndarray) -> np.ndarray:
    """1 / d from the seed 0x7EF311C3 - bits(d) and three Newton steps r + r * (1 - d * r), each one fma."""
    r = (np.int64(0x7EF311C3) - d.view(np.int32).astype(np.int64)).astype(np.int32).view(np.float32)
    for _ in range(3):
        r = _np_fma(r, _np_fma(-d, r, 1.0), r)
    return r


def _np_swiglu(g: np.ndarray, u: np.ndarray, scale: float | None, limit: float | None, alpha: float,
               beta: float) -> np.ndarray:
    """float32 numpy, one rounding per operation; scaling by ldexp where the kernel adds to the exponent field."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        if limit is not None:
            g = np.where(g > f32(limit), f32(limit), g)
            u = np.where(u < -f32(limit), -f32(limit), np.where(u > f32(limit), f32(limit), u))
        coef = f32(f32(-alpha) * f32(np.log2(np.e)))
        bounds = sorted((f32(-125.0 / float(coef)), f32(125.0 / float(coef)))) if coef else (-np.inf, np.inf)
        x = np.fmin(np.fmax(g, f32(bounds[0])), f32(bounds[1])).astype(np.float64) * float(coef)
        n = np.rint(x)
        f = (x - n).astype(np.float32)
        p = _np_fma(ops_cpu.EXP2_COEFFS[4], f, ops_cpu.EXP2_COEFFS[3])
        for c in (*ops_cpu.EXP2_COEFFS[2::-1], 1.0):
            p = _np_fma(p, f, c)
        sigmoid = _np_reciprocal(np.ldexp(p, n.astype(np.int32)) + f32(1))
        out = (g * (u + f32(beta))) * sigmoid
        return out if scale is None else out * (f32(1) / f32(scale))


def _np_reference(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None, **kwargs) -> torch.Tensor:
    y = torch.from_numpy(_np_swiglu(gate.float().numpy(), up.float().numpy(),
                                    None if scale is None else scale.item(), kwargs.get("limit"),
                                    kwargs.get("alpha", 1.0), kwargs.get("beta", 0.0)))
    return y.clamp(-448, 448).to(FP8) if scale is not None else y.to(gate.dtype)


def _gate_up_with_every_gate_value(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """gate: every 16-bit pattern plus special values; up: random values of several magnitudes plus specials."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.float32:
        gate = torch.cat([torch.randn(1 << 16, generator=gen) * 30, _specials(dtype)])
    else:
        gate = torch.cat([_all_16bit_values(dtype), _specials(dtype)])
    up = torch.randn(gate.shape, generator=gen) * torch.tensor([0.01, 1.0, 100.0]).repeat(gate.numel() // 3 + 1)[
        :gate.numel()]
    up[-len(_specials(dtype)):] = _specials(dtype).float().flip(0)
    return gate, up.to(dtype)


# --- CPU ---

@pytest.mark.parametrize("fp8_out", OUTPUTS)
@pytest.mark.parametrize("kwargs", SWIGLU_KWARGS)
def test_opcheck_silu_and_mul_2in(fp8_out, kwargs):
    scale = _scale() if fp8_out else None
    opcheck(torch.ops.cosmos3.silu_and_mul_2in.default, (_bf16(7, 33), _bf16(7, 33), scale),
            {k: v for k, v in kwargs.items()})


def test_opcheck_quantize_fp8():
    opcheck(torch.ops.cosmos3.quantize_fp8.default, (_bf16(7, 33), _scale()))


@pytest.mark.parametrize("dtype", DEQUANTIZE_DTYPES)
def test_opcheck_dequantize_fp8(dtype):
    opcheck(torch.ops.cosmos3.dequantize_fp8.default, (_fp8(7, 33), _scale(), dtype), test_utils=OPCHECK_FP8_INPUT)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(("op", "make", "message"), INVALID_CALLS)
def test_every_op_names_the_broken_rule(op, make, message, device):
    with pytest.raises(ValueError, match=message):
        op(**make(device))


@pytest.mark.parametrize("fp8_out", OUTPUTS)
@pytest.mark.parametrize("shape", RANK_SHAPES)
def test_any_rank_gives_the_flat_result_in_the_input_shape(shape, fp8_out):
    gate, up = _bf16(*shape), _bf16(*shape)
    scale = _scale() if fp8_out else None
    out = ops.silu_and_mul_2in(gate, up, scale=scale)
    flat = ops.silu_and_mul_2in(gate.reshape(-1), up.reshape(-1), scale=scale)
    assert out.shape == shape
    assert_same_bits(out.reshape(-1), flat)
    fake = ops.silu_and_mul_2in(gate.to("meta"), up.to("meta"), scale=None if scale is None else scale.to("meta"))
    assert (fake.shape, fake.dtype) == (out.shape, out.dtype)


@pytest.mark.parametrize("fp8_out", OUTPUTS)
@pytest.mark.parametrize("kwargs", SWIGLU_KWARGS)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_cpu_impl_equals_independent_formula_bit_for_bit(dtype, kwargs, fp8_out):
    gate, up = _gate_up_with_every_gate_value(dtype)
    scale = _scale(0.05) if fp8_out else None
    assert_same_bits(ops.silu_and_mul_2in(gate, up, scale=scale, **kwargs), _np_reference(gate, up, scale, **kwargs))


def test_constants_agree_with_the_kernel():
    assert ops_cpu.LOG2E_F32 == float(np.float32(np.log2(np.e)))
    source = (CSRC / "silu_and_mul_2in.cu").read_text()
    hex_float = r"(0x[0-9a-fp.+-]+)f;"
    assert [float.fromhex(h) for h in re.findall(r"constexpr float kExp2C\d = " + hex_float, source)] == list(
        ops_cpu.EXP2_COEFFS)
    assert float.fromhex(re.search(r"constexpr float kLog2e = " + hex_float, source).group(1)) == ops_cpu.LOG2E_F32
    bounds = [float(b) for b in re.findall(r"constexpr double kExp2M(?:in|ax) = ([-0-9.]+);", source)]
    assert bounds == [ops_cpu.EXP2_MIN, ops_cpu.EXP2_MAX]
    seed = re.search(r"constexpr uint32_t kRecipSeed = (0x[0-9A-Fa-f]+)u;", source).group(1)
    assert int(seed, 16) == ops_cpu.RECIP_SEED
    assert int(re.search(r"constexpr int kNewtonSteps = (\d+);", source).group(1)) == ops_cpu.NEWTON_STEPS


def test_reciprocal_is_within_half_an_ulp_over_its_whole_range():
    """Every mantissa at the two exponents the seed's error cycles through (it repeats every other binade),
    plus the top of the range, 2^125.5 (1 + 2^125 * sqrt(2) as the exponential can reach it)."""
    mantissas = np.arange(1 << 23, dtype=np.int64)
    d = np.concatenate([((127 + e) << 23 | mantissas).astype(np.int32).view(np.float32) for e in (0, 1)]
                       + [np.float32([2.0 ** 125.5, 2.0 ** 124])])
    r = ops_cpu.reciprocal(torch.from_numpy(d)).numpy().astype(np.float64)
    exact = 1 / d.astype(np.float64)
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert (np.abs(r - exact) / ulp).max() < 0.5006
    np.testing.assert_array_equal(r.astype(np.float32), _np_reciprocal(d))


def _exact_fma_f32(a: float, b: float, c: float) -> float:
    """fp32 nearest (ties to even) to a * b + c, in exact rational arithmetic."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    near = np.float32(float(exact))
    candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
    return float(min(candidates, key=lambda x: (abs(Fraction(float(x)) - exact), int(x.view(np.int32)) & 1)))


def test_fma_emulations_are_correctly_rounded():
    gen = np.random.default_rng(3)
    a = (gen.standard_normal(4000) * 10.0 ** gen.integers(-3, 3, 4000)).astype(np.float32)
    b = gen.uniform(-0.5, 0.5, 4000).astype(np.float32)
    c = np.float32(gen.standard_normal(4000))
    # 1 + 2^-24 is halfway between fp32 1 and 1 + 2^-23; a * b exceeds 2^-24 by ~2^-58, below fp64's resolution
    # at 1, so rounding a * b + 1 through fp64 lands on the halfway point and then wrongly on 1.
    a, b, c = (np.append(v, w).astype(np.float32) for v, w in
               ((a, 1 + 2896 * 2.0 ** -23), (b, 2.0 ** -24 * (1 - 2895 * 2.0 ** -23)), (c, 1.0)))
    assert np.float32(a[-1].astype(np.float64) * b[-1] + 1.0) == 1.0
    exact = np.array([_exact_fma_f32(*map(float, abc)) for abc in zip(a, b, c, strict=True)], np.float32)
    assert exact[-1] == np.float32(1 + 2.0 ** -23)
    np.testing.assert_array_equal(_np_fma(a, b, c), exact)
    ours = np.array([ops_cpu.fma_f32(torch.tensor([x]), float(y), float(z)).item()
                     for x, y, z in zip(a, b, c, strict=True)])
    np.testing.assert_array_equal(ours.astype(np.float32), exact)


def test_reciprocal_then_one_fma_divides_correctly():
    """The kernels' divide(): q = x * fp32(1 / s), r = fma(-q, s, x), then fma(r, 1 / s, q) where r is finite and
    not zero, else q. Every mantissa of x and specials, for several scales, against numpy's x / s: the same
    fp32 bits while the residual cannot underflow (|x| >= 2^-100), the same FP8 bits for every x."""
    x = np.concatenate([((127 << 23) | np.arange(1 << 23, dtype=np.int64)).astype(np.int32).view(np.float32),
                        np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 2.0 ** -100, 1e-38, 1e-45])])
    for s in np.float32([0.02, 0.05, 0.37, 3.0, 0.0123456, 1e-20, 3e38, 0.0, np.inf]):
        with np.errstate(all="ignore"):
            inv = np.float32(1) / s
            q = x * inv
            r = _np_fma(-q, s, x)
            got, want = np.where((np.abs(r) > 0) & (np.abs(r) < np.inf), _np_fma(r, inv, q), q), x / s
        fp32_exact = (np.abs(x) >= 2.0 ** -100) | (x == 0)
        assert_same_bits(torch.from_numpy(got[fp32_exact]), torch.from_numpy(want[fp32_exact]))
        fp8 = [torch.from_numpy(v).clamp(-448, 448).to(FP8) for v in (got, want)]
        assert_same_bits(*fp8)


@pytest.mark.parametrize("kwargs", SWIGLU_KWARGS)
def test_fp32_result_is_within_a_few_ulp_of_the_exact_formula(kwargs):
    gen = torch.Generator().manual_seed(1)
    gate, up = torch.randn(1 << 18, generator=gen) * 20, torch.randn(1 << 18, generator=gen) * 10
    out = ops.silu_and_mul_2in(gate, up, **kwargs).double()
    g, u = gate.double(), up.double()
    if "limit" in kwargs:
        g, u = g.clamp(max=kwargs["limit"]), u.clamp(-kwargs["limit"], kwargs["limit"])
    alpha_g = kwargs.get("alpha", 1.0) * g
    exact = g * torch.sigmoid(alpha_g) * (u + kwargs.get("beta", 0.0))
    ulps = (out - exact).abs() / (exact.abs() * torch.finfo(torch.float32).eps)
    # exp(-alpha * g) is 2^(g * fp32(-alpha * log2 e)): that product's rounding costs up to |alpha * g| ulp
    normal = exact.abs() > 1e-30
    assert (ulps[normal] <= 8 + alpha_g.abs()[normal]).all()


def test_fp8_output_saturates_instead_of_overflowing_to_nan():
    x = torch.tensor([463.0, 464.0, 465.0, 1e6, float("inf"), -1e6, float("-inf"), float("nan"), 2.0 ** -10])
    codes = _bits(ops.quantize_fp8(x, _scale(1.0))).tolist()
    assert codes[:7] == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE]  # +-448
    assert torch.isnan(ops.quantize_fp8(x, _scale(1.0)).float()[7])
    assert codes[8] == 0  # 2^-10 is half the smallest subnormal: ties to even, to zero


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_quantize_fp8_divides_by_the_scale_then_rounds(dtype):
    x = torch.cat([_all_16bit_values(torch.bfloat16).float(), _specials(torch.float32)]).to(dtype)
    scale = _scale(0.37)
    expected = (x.float() / 0.37).clamp(-448, 448).to(FP8)
    assert_same_bits(ops.quantize_fp8(x, scale), expected)


@pytest.mark.parametrize("dtype", DEQUANTIZE_DTYPES)
def test_dequantize_fp8_multiplies_in_fp32_then_rounds_once(dtype):
    """Every FP8 code: the op is (w.float() * scale).to(dtype), whose fp32 product is the exact one (taken in
    fp64, where it is exact) rounded to nearest even; the scale is not rounded to bf16 first, as CUDA eager
    torch's w.to(bf16) * scale does."""
    w = _every_fp8_code()
    for value in DEQUANTIZE_SCALES:
        scale = _scale(value)
        out = ops.dequantize_fp8(w, scale, dtype)
        assert_same_bits(out, (w.float() * scale).to(dtype))
        exact = torch.from_numpy((w.double().numpy() * np.float64(np.float32(value))).astype(np.float32))
        assert_same_bits(out, exact.to(dtype))
        assert_same_bits(ops.dequantize_fp8(w.reshape(16, 16), scale.reshape(()), dtype), out.reshape(16, 16))
    bf16_scale = (w.to(torch.bfloat16) * _scale(0.0123456).bfloat16()).to(dtype)
    assert not torch.equal(_bits(ops.dequantize_fp8(w, _scale(0.0123456), dtype)), _bits(bf16_scale))


def test_compile_fullgraph_on_cpu_matches_eager():
    def fn(gate, up, scale):
        return ops.silu_and_mul_2in(gate, up, scale=scale, limit=7.0), ops.quantize_fp8(ops.silu_and_mul_2in(gate, up),
                                                                                        scale)

    gate, up, scale = _bf16(3, 5, 64), _bf16(3, 5, 64), _scale()
    for got, want in zip(torch.compile(fn, fullgraph=True)(gate, up, scale), fn(gate, up, scale), strict=True):
        assert_same_bits(got, want)


def test_launch_table_rows_fit_the_kernels():
    for sm, row in [*launch_table.TABLE.items(), (0, launch_table.DEFAULT)]:
        assert set(row) == set(launch_table.OPS), sm
        for params in row.values():
            threads, vectors = params.threads, params.vectors_per_thread
            assert 32 <= threads <= 1024 and threads & (threads - 1) == 0, (sm, params)
            assert vectors in (1, 2, 4) and threads * vectors <= 1024, (sm, params)
    assert {90, 100} <= set(launch_table.TABLE)


def test_unknown_arch_gets_the_default_row_and_one_log_line(monkeypatch):
    calls = []
    monkeypatch.setattr(launch_table, "log", SimpleNamespace(warning=lambda *a, **kw: calls.append(kw)))
    launch_table._log_unknown_arch.cache_clear()
    assert launch_table.launch_params(999) is launch_table.DEFAULT
    assert launch_table.launch_params(999) is launch_table.DEFAULT
    assert [c["sm"] for c in calls] == [999]


# --- GPU (H200) ---

GPU_SHAPES = [
    pytest.param((8, 4), id="8x4"),
    pytest.param((13, 257), id="13x257"),
    pytest.param((1760, 12288), id="1760x12288"),
    pytest.param((88320, 12288), id="88320x12288"),
]
LAUNCH_CONFIGS = [launch_table.LaunchParams(t, v) for t in (32, 64, 128, 256, 512, 1024) for v in (1, 2, 4)
                  if t * v <= 1024]
GPU_VARIANTS = [  # input dtype, FP8 output
    pytest.param(torch.bfloat16, False, id="bf16"),
    pytest.param(torch.float16, False, id="fp16"),
    pytest.param(torch.bfloat16, True, id="bf16-to-fp8"),
]


def _cpu_reference(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None, **kwargs) -> torch.Tensor:
    """The op's CPU impl on host copies, CHUNK elements per call."""
    g, u = gate.cpu().reshape(-1), up.cpu().reshape(-1)
    s = None if scale is None else scale.cpu()
    parts = [ops.silu_and_mul_2in(a, b, scale=s, **kwargs) for a, b in zip(g.split(CHUNK), u.split(CHUNK), strict=True)]
    return torch.cat(parts).reshape(gate.shape)


def _random_gate_up(shape, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    gate = (torch.randn(shape, device="cuda", generator=gen) * 3).to(dtype)
    up = (torch.randn(shape, device="cuda", generator=gen) * 2).to(dtype)
    return gate, up


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "fp8_out"), GPU_VARIANTS)
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_matches_cpu_impl_bit_for_bit(shape, dtype, fp8_out):
    gate, up = _random_gate_up(shape, dtype)
    scale = _scale(0.02, "cuda") if fp8_out else None
    out = ops.silu_and_mul_2in(gate, up, scale=scale).cpu()
    assert_same_bits(out, _cpu_reference(gate, up, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_gpu_every_launch_config_gives_the_same_bits(dtype):
    ext = ops.load_cuda_ops().module
    sm = ops_loader.sm_version(torch.cuda.current_device())
    gate, up = _random_gate_up((1001, 1031), dtype)  # several blocks, a partial last block and a 7-element tail
    scale = _scale(0.02, "cuda")
    swiglu = _cpu_reference(gate, up, scale)
    quantized = ops.quantize_fp8(gate.cpu(), scale.cpu())
    dequantized = ops.dequantize_fp8(quantized, scale.cpu(), torch.bfloat16)
    try:
        for params in LAUNCH_CONFIGS:
            ops_loader.set_launch_params(ext, sm, dict.fromkeys(launch_table.OPS, params))
            assert_same_bits(ops.silu_and_mul_2in(gate, up, scale=scale).cpu(), swiglu)
            assert_same_bits(ops.quantize_fp8(gate, scale).cpu(), quantized)
            assert_same_bits(ops.dequantize_fp8(quantized.cuda(), scale, torch.bfloat16).cpu(), dequantized)
    finally:
        ops_loader.set_launch_params(ext, sm, launch_table.launch_params(sm))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8_out", OUTPUTS)
@pytest.mark.parametrize("kwargs", SWIGLU_KWARGS)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_gpu_every_gate_value_and_special_values_match_cpu(dtype, kwargs, fp8_out):
    gate, up = _gate_up_with_every_gate_value(dtype, seed=2)
    scale = _scale(0.05) if fp8_out else None
    out = ops.silu_and_mul_2in(gate.cuda(), up.cuda(), scale=None if scale is None else scale.cuda(), **kwargs)
    assert_same_bits(out.cpu(), ops.silu_and_mul_2in(gate, up, scale=scale, **kwargs))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(13, 257), (1760, 12288)])
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_gpu_quantize_fp8_matches_cpu(dtype, shape):
    x = torch.randn(shape, device="cuda").mul(300).to(dtype)
    x.view(-1)[:18] = _specials(dtype).cuda()
    scale = _scale(0.37, "cuda")
    assert_same_bits(ops.quantize_fp8(x, scale).cpu(), ops.quantize_fp8(x.cpu(), scale.cpu()))


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [0.0, float("inf"), 1e-20, 3e38, 2.0 ** -3],
                         ids=["zero", "inf", "tiny", "huge", "power-of-two"])
def test_gpu_fp8_outputs_match_cpu_for_extreme_scales(scale):
    """The kernels' division (a reciprocal and one fma) against the CPU's true division where it is hardest."""
    gate, up = _gate_up_with_every_gate_value(torch.bfloat16, seed=3)
    s = _scale(scale)
    swiglu = ops.silu_and_mul_2in(gate.cuda(), up.cuda(), scale=s.cuda())
    assert_same_bits(swiglu.cpu(), ops.silu_and_mul_2in(gate, up, scale=s))
    assert_same_bits(ops.quantize_fp8(gate.cuda(), s.cuda()).cpu(), ops.quantize_fp8(gate, s))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DEQUANTIZE_DTYPES)
@pytest.mark.parametrize("shape", [(12288, 4096), (4096, 12288), (1024, 4096), (13, 257), (7,)],
                         ids=["gate-up", "down", "k-v", "13x257", "7"])
def test_gpu_dequantize_fp8_matches_cpu(shape, dtype):
    """Nano's weight shapes, a 13-element tail after the last 16-byte vector, and a tensor that is all tail;
    random bytes, so every code (NaNs included) appears."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda", generator=gen).view(FP8)
    scale = _scale(0.0123456, "cuda")
    assert_same_bits(ops.dequantize_fp8(weight, scale, dtype).cpu(),
                     ops.dequantize_fp8(weight.cpu(), scale.cpu(), dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DEQUANTIZE_DTYPES)
def test_gpu_dequantize_fp8_every_code_and_extreme_scale_matches_cpu(dtype):
    w = _every_fp8_code()
    for value in [*DEQUANTIZE_SCALES, 0.0, float("inf"), 1e-40, 3e38]:  # 1e-40: fp32 subnormal products
        scale = _scale(value)
        assert_same_bits(ops.dequantize_fp8(w.cuda(), scale.cuda(), dtype).cpu(), ops.dequantize_fp8(w, scale, dtype))


@pytest.mark.gpu
def test_gpu_input_off_a_16_byte_boundary_takes_the_scalar_path():
    gate_buf, up_buf = _random_gate_up((1 + 13 * 257,), torch.bfloat16)
    gate, up = gate_buf[1:].view(13, 257), up_buf[1:].view(13, 257)
    for scale in (None, _scale(0.02, "cuda")):
        assert_same_bits(ops.silu_and_mul_2in(gate, up, scale=scale).cpu(), _cpu_reference(gate, up, scale))
    assert_same_bits(ops.quantize_fp8(gate, _scale(0.02, "cuda")).cpu(), ops.quantize_fp8(gate.cpu(), _scale(0.02)))
    weight = ops.quantize_fp8(gate_buf, _scale(0.02, "cuda"))[1:].view(13, 257)
    assert_same_bits(ops.dequantize_fp8(weight, _scale(0.02, "cuda"), torch.bfloat16).cpu(),
                     ops.dequantize_fp8(weight.cpu(), _scale(0.02), torch.bfloat16))


@pytest.mark.gpu
def test_gpu_compile_fullgraph_matches_eager():
    def fn(gate, up, scale):
        return (ops.silu_and_mul_2in(gate, up, scale=scale, limit=7.0, alpha=1.702, beta=1.0),
                ops.quantize_fp8(ops.silu_and_mul_2in(gate, up), scale))

    gate, up = _random_gate_up((4, 33, 1024), torch.bfloat16)
    scale = _scale(0.02, "cuda")
    for got, want in zip(torch.compile(fn, fullgraph=True)(gate, up, scale), fn(gate, up, scale), strict=True):
        assert_same_bits(got.cpu(), want.cpu())


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_reads_the_scale_updated_in_place():
    gate, up = _random_gate_up((64, 1000), torch.bfloat16)
    scale = _scale(0.02, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (and first-use load) outside the capture
        ops.silu_and_mul_2in(gate, up, scale=scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.silu_and_mul_2in(gate, up, scale=scale)
    scale.fill_(0.05)
    graph.replay()
    torch.cuda.synchronize()
    assert_same_bits(out.cpu(), _cpu_reference(gate, up, _scale(0.05)))
    assert not torch.equal(_bits(out.cpu()), _bits(_cpu_reference(gate, up, _scale(0.02))))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8_out", OUTPUTS)
@pytest.mark.parametrize("kwargs", SWIGLU_KWARGS)
def test_gpu_opcheck_silu_and_mul_2in(kwargs, fp8_out):
    gate, up = _random_gate_up((7, 1000), torch.bfloat16)
    opcheck(torch.ops.cosmos3.silu_and_mul_2in.default, (gate, up, _scale(0.02, "cuda") if fp8_out else None),
            kwargs)


@pytest.mark.gpu
def test_gpu_opcheck_quantize_fp8():
    opcheck(torch.ops.cosmos3.quantize_fp8.default, (_bf16(7, 1000, device="cuda"), _scale(0.02, "cuda")))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DEQUANTIZE_DTYPES)
def test_gpu_opcheck_dequantize_fp8(dtype):
    opcheck(torch.ops.cosmos3.dequantize_fp8.default, (_fp8(7, 1000, device="cuda"), _scale(0.02, "cuda"), dtype),
            test_utils=OPCHECK_FP8_INPUT)


@pytest.mark.gpu
@pytest.mark.parametrize(("op", "make", "message"), INVALID_CALLS)
def test_gpu_every_op_names_the_broken_rule(op, make, message):
    with pytest.raises(ValueError, match=message):
        op(**make("cuda"))


@pytest.mark.gpu
def test_gpu_scale_on_another_device_is_rejected():
    with pytest.raises(ValueError, match="scale must be on the input's device"):
        ops.silu_and_mul_2in(_bf16(4, 8, device="cuda"), _bf16(4, 8, device="cuda"), scale=_scale())
