"""torch.ops.cosmos3's norms: rms_norm (optionally FP8 out) and add_rms_norm. attention_inputs, whose QK norms sum in
the same order, is tested in test_attention_inputs.py.

CPU tests (CI): registration (opcheck), argument checks, the CPU impl's sum order against a scalar walk of the
kernel's lanes in exact arithmetic, its values against an fp64 formula, the fused forms against their parts.
GPU tests (``-m gpu``): the CUDA kernels against the CPU impl bit for bit (vector and element paths, every
dtype), and under CUDA-graph replay.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.library import opcheck

from cosmos3 import ops
from cosmos3.ops import cpu as ops_cpu
from tests.cosmos3.test_ops import _exact_fma_f32, assert_same_bits

FP8 = torch.float8_e4m3fn
EPS = 1e-6
DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.float32, id="fp32")]
# Row lengths: Nano's hidden size (256 lanes, two chunks each), a head (one chunk a lane, 16 lanes), rows that
# span 2 and 4 warps with a lane short of chunks (300: 38 chunks; 1001: 126, the last one element), short and odd
# rows (a partial chunk, the element path), one element.
DIMS = [4096, 1001, 300, 128, 100, 24, 7, 1]


def _rows(rows, dim, dtype=torch.bfloat16, device="cpu", seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    offset = torch.randn(dim, generator=gen)  # a shared per-channel bias, as activations have
    return ((torch.randn(rows, dim, generator=gen) + offset) * scale).to(dtype).to(device)


def _weight(dim, dtype=torch.bfloat16, device="cpu", seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.exp(torch.randn(dim, generator=gen) * 0.5).to(dtype).to(device)


def _exact_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp64 RMSNorm, in fp64."""
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()


def _reference_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp64 RMSNorm, rounded once to x's dtype."""
    return _exact_norm(x, weight).to(x.dtype)


def _ulps(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """|actual - expected| in units of expected's dtype spacing at expected."""
    e = expected.double()
    step = torch.from_numpy(np.spacing(np.abs(e.numpy()).astype(
        {torch.bfloat16: np.float32, torch.float16: np.float16, torch.float32: np.float32}[expected.dtype])))
    if expected.dtype == torch.bfloat16:
        step = step * 2.0 ** 16  # bf16 keeps 8 of fp32's 24 bits
    return (actual.double() - e).abs() / step.double()


INVALID_CALLS = [
    pytest.param(lambda d: (ops.rms_norm, (torch.ones(4, 8, dtype=torch.int32, device=d), _weight(8, device=d), EPS)),
                 "x must be bfloat16, float16 or float32", id="rms_norm-int-x"),
    pytest.param(lambda d: (ops.rms_norm, (_rows(8, 4, device=d).t(), _weight(8, device=d), EPS)),
                 "x must be contiguous", id="rms_norm-transposed"),
    pytest.param(lambda d: (ops.rms_norm, (_rows(4, 0, device=d), _weight(0, device=d), EPS)),
                 "non-empty last dim", id="rms_norm-empty-dim"),
    pytest.param(lambda d: (ops.rms_norm, (_rows(4, 8, device=d), _weight(8, device=d).half(), EPS)),
                 "weight must have x's dtype", id="rms_norm-weight-dtype"),
    pytest.param(lambda d: (ops.rms_norm, (_rows(4, 8, device=d), _weight(16, device=d), EPS)),
                 r"weight must have shape \[8\]", id="rms_norm-weight-shape"),
    pytest.param(lambda d: (ops.rms_norm, (_rows(4, 8, device=d), _weight(8, device=d), EPS),
                            {"scale": torch.ones(2, device=d)}),
                 "scale must have exactly one element", id="rms_norm-scale"),
    pytest.param(lambda d: (ops.add_rms_norm, (_rows(4, 8, device=d), _rows(4, 16, device=d), _weight(8, device=d),
                                               EPS)),
                 "delta must match x", id="add_rms_norm-delta-shape"),
    pytest.param(lambda d: (ops.add_rms_norm, (_rows(4, 8, device=d), _rows(4, 16, device=d)[:, ::2],
                                               _weight(8, device=d), EPS)),
                 "delta must be contiguous", id="add_rms_norm-strided-delta"),
]


# --- CPU ---

@pytest.mark.parametrize("fp8_out", [False, True], ids=["same-dtype-out", "fp8-out"])
def test_opcheck_norms(fp8_out):
    scale = torch.tensor([0.02]) if fp8_out else None
    opcheck(torch.ops.cosmos3.rms_norm.default, (_rows(7, 40), _weight(40), EPS, scale))
    opcheck(torch.ops.cosmos3.add_rms_norm.default, (_rows(7, 40), _rows(7, 40, seed=2), _weight(40), EPS, scale))


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(("make", "message"), INVALID_CALLS)
def test_every_norm_op_names_the_broken_rule(make, message, device):
    op, args, *kwargs = make(device)
    with pytest.raises(ValueError, match=message):
        op(*args, **(kwargs[0] if kwargs else {}))


def _lane_walk_sum_of_squares(row: np.ndarray) -> float:
    """The kernel's sum, element by element in exact arithmetic: lane l adds chunks l, l + lanes, ... with one
    correctly rounded fmaf per element (a row has at most 256 lanes), then the butterfly over lanes."""
    dim = len(row)
    chunks = -(-dim // 8)
    lanes = 1
    while lanes < chunks and lanes < 256:
        lanes *= 2
    acc = [0.0] * lanes
    for c in range(chunks):
        for j in range(8 * c, min(8 * c + 8, dim)):
            v = float(row[j])
            acc[c % lanes] = _exact_fma_f32(v, v, acc[c % lanes])
    offset = lanes // 2
    while offset:
        acc = [float(np.float32(acc[i]) + np.float32(acc[i ^ offset])) for i in range(lanes)]
        offset //= 2
    assert len(set(acc)) == 1  # every lane of a row ends with the same sum, as the kernel's butterfly
    return acc[0]


@pytest.mark.parametrize("dim", [5000, 4096, 2500, 1001, 300, 128, 24, 7, 1])
def test_cpu_sum_order_is_the_kernels_lane_walk(dim):
    x = _rows(3, dim, torch.float32, scale=3.0)
    ours = ops_cpu._sum_of_squares(x)
    for r in range(3):
        assert ours[r].item() == _lane_walk_sum_of_squares(x[r].numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", DIMS)
def test_rms_norm_is_the_fp64_norm_within_one_rounding(dim, dtype):
    x, w = _rows(64, dim, dtype), _weight(dim, dtype)
    ulps = _ulps(ops.rms_norm(x, w, EPS), _reference_norm(x, w))
    if dtype == torch.float32:  # the sum, square root, division and two products each round in fp32
        assert ulps.max() <= 8.0 and ulps.median() <= 1.0
    else:  # one rounding of a value within fp32 error of the exact one
        assert ulps.max() <= 1.0 and (ulps == 0).float().mean() > 0.97


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [4096, 100, 7])
def test_fused_forms_are_their_parts_bit_for_bit(dim, dtype):
    x, d, w = _rows(33, dim, dtype), _rows(33, dim, dtype, seed=5), _weight(dim, dtype)
    scale = torch.tensor([0.013])
    total, normed = ops.add_rms_norm(x, d, w, EPS)
    assert_same_bits(total, (x.float() + d.float()).to(dtype))  # the residual add, one rounding
    assert_same_bits(normed, ops.rms_norm(total, w, EPS))
    total_fp8, normed_fp8 = ops.add_rms_norm(x, d, w, EPS, scale=scale)
    assert_same_bits(total_fp8, total)
    # FP8 out is quantize_fp8 of the rounded norm: what a W8A8 projection would have made of it.
    assert_same_bits(normed_fp8, ops.quantize_fp8(normed, scale))
    assert_same_bits(ops.rms_norm(x, w, EPS, scale=scale), ops.quantize_fp8(ops.rms_norm(x, w, EPS), scale))


def test_fp8_out_saturates_instead_of_overflowing_to_nan():
    x, w = _rows(4, 64, scale=50.0), _weight(64)
    out = ops.rms_norm(x, w, EPS, scale=torch.tensor([1e-3])).float()
    assert not out.isnan().any() and out.abs().max() == 448.0


# --- GPU ---

def _both(fn, *tensors):
    """fn on CUDA copies and on the CPU tensors, the CUDA result brought back."""
    gpu = fn(*(t.cuda() if isinstance(t, torch.Tensor) else t for t in tensors))
    cpu = fn(*tensors)
    to_cpu = (lambda r: tuple(t.cpu() for t in r)) if isinstance(gpu, tuple) else (lambda r: r.cpu())
    return to_cpu(gpu), cpu


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "dim"), [(1024, 4096), (333, 4096), (33, 5000), (65, 2500), (129, 1001), (99, 300),
                                            (77, 100), (50, 7), (1, 1), (4000, 128), (70, 264), (90, 6000),
                                            (17, 8200)])
def test_gpu_norms_match_cpu_bit_for_bit(rows, dim, dtype):
    """Aligned rows of up to 4 chunks a lane run the registers-held kernel (128, 264: one; 4096: two; 6000: three of
    four, lanes short of chunks), longer ones (8200) and unaligned ones the two-pass kernel."""
    x, d, w = _rows(rows, dim, dtype, scale=2.0), _rows(rows, dim, dtype, seed=3), _weight(dim, dtype)
    scale = torch.tensor([0.02])
    for fn in (lambda x, d, w, s: ops.rms_norm(x, w, EPS),
               lambda x, d, w, s: ops.rms_norm(x, w, EPS, scale=s),
               lambda x, d, w, s: ops.add_rms_norm(x, d, w, EPS),
               lambda x, d, w, s: ops.add_rms_norm(x, d, w, EPS, scale=s)):
        gpu, cpu = _both(fn, x, d, w, scale)
        for g, c in zip(gpu if isinstance(gpu, tuple) else (gpu,), cpu if isinstance(cpu, tuple) else (cpu,),
                        strict=True):
            assert_same_bits(g, c)


@pytest.mark.gpu
def test_gpu_norm_off_a_16_byte_boundary_takes_the_element_path():
    buf, w = _rows(1, 1 + 20 * 4096).view(-1), _weight(4096)
    x = buf[1:].view(20, 4096)  # a contiguous view 2 bytes past the allocation
    gpu, cpu = _both(lambda x, w: ops.rms_norm(x, w, EPS, scale=torch.tensor([0.02], device=x.device)), x, w)
    assert_same_bits(gpu, cpu)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_reads_the_scale_and_inputs_updated_in_place():
    x, d, w = _rows(64, 256, device="cuda"), _rows(64, 256, device="cuda", seed=4), _weight(256, device="cuda")
    scale = torch.tensor([0.02], device="cuda")
    ops.add_rms_norm(x, d, w, EPS, scale=scale)  # loads the kernels before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        total, normed = ops.add_rms_norm(x, d, w, EPS, scale=scale)
    x.copy_(_rows(64, 256, device="cuda", seed=9))
    scale.fill_(0.05)
    graph.replay()
    expected_total, expected = ops.add_rms_norm(x.cpu(), d.cpu(), w.cpu(), EPS, scale=scale.cpu())
    assert_same_bits(total.cpu(), expected_total)
    assert_same_bits(normed.cpu(), expected)
