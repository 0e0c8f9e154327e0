"""torch.ops.cosmos3.attention_inputs: q's and k's QK norm and RoPE, and k and v after the UND K/V, in one kernel.

CPU tests (CI): registration (opcheck), argument checks, the CPU impl's q and k against an fp64 norm and
rotate-half, its prefix rows and v against the prefixes and the concatenation bit for bit, strided tokens (a
fused QKV's slices) against their contiguous copies, and MoTAttention's towers (split and fused QKV) against
the four ops the op replaced. GPU tests (``-m gpu``): the CUDA kernel against the CPU
impl bit for bit (every dtype; head dims on the vector and element paths, copies included; strided tokens;
empty and non-empty prefixes; inputs off a 16-byte boundary), the argument checks in C++, and CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from cosmos3 import ops
from cosmos3.layers.attention import GEN, UND, MoTAttention
from cosmos3.layers.linear import Linear
from cosmos3.ops import cpu as ops_cpu
from cosmos3.quant import UNQUANTIZED
from tests.cosmos3.test_norm_ops import DTYPES, EPS, _exact_norm, _rows, _weight
from tests.cosmos3.test_ops import assert_same_bits

# Head dims: a Nano head (16 lanes a row), 64, one chunk (the norms' element path: dim % 16 != 0), and a partial
# chunk (the element path for the copies too: 12 bytes a 16-bit row).
HEAD_DIMS = [128, 64, 8, 6]
PREFIXES = [pytest.param(0, id="und-tower"), pytest.param(5, id="gen-after-und")]
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}  # 2^-precision


def _heads(tokens, heads, dim, dtype=torch.bfloat16, device="cpu", seed=0):
    return _rows(tokens, heads * dim, dtype, device, seed).view(tokens, heads, dim)


def _angles(tokens, dim, device="cpu"):
    """[tokens, dim] rotary angles, each frequency twice (rotate-half's layout)."""
    angles = torch.arange(tokens, dtype=torch.float32)[:, None] * torch.linspace(0.01, 3.0, dim // 2)
    return torch.cat([angles, angles], dim=-1).to(device)


def _tables(tokens, dim, dtype=torch.bfloat16, device="cpu"):
    """cos and the signed sin of cosmos3.layers.rope.MRoPE: sin of the negated angle in the first half."""
    angles = _angles(tokens, dim, device)
    signed = torch.cat([-angles[:, : dim // 2], angles[:, dim // 2:]], dim=-1)
    return angles.cos().to(dtype), signed.sin().to(dtype)


def _projections(tokens, heads, kv_heads, dim, dtype=torch.bfloat16, device="cpu", seed=0, *, fused=True,
                 scale=1.0):
    """q [tokens, heads, dim], k and v [tokens, kv_heads, dim]: column slices of one fused QKV output (strided
    tokens) or three contiguous tensors."""
    if not fused:
        return tuple(_heads(tokens, h, dim, dtype, device, seed + i) * scale
                     for i, h in enumerate((heads, kv_heads, kv_heads)))
    out = _rows(tokens, (heads + 2 * kv_heads) * dim, dtype, device, seed, scale)  # [tokens, (nh + 2 nkv) * hd]
    q, k, v = out.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)


def _call(tokens=4, heads=2, kv_heads=1, dim=8, prefix=3, dtype=torch.bfloat16, device="cpu", seed=0, *,
          fused=True, scale=1.0):
    """attention_inputs' arguments, by name: a GEN layer's, after ``prefix`` UND tokens."""
    q, k, v = _projections(tokens, heads, kv_heads, dim, dtype, device, seed, fused=fused, scale=scale)
    cos, sin = _tables(tokens, dim, dtype, device)
    return {"q": q, "k": k, "v": v, "q_weight": _weight(dim, dtype, device, seed + 1),
            "k_weight": _weight(dim, dtype, device, seed + 2), "eps": EPS, "cos": cos, "sin": sin,
            "k_prefix": _heads(prefix, kv_heads, dim, dtype, device, seed + 3),
            "v_prefix": _heads(prefix, kv_heads, dim, dtype, device, seed + 4)}


# Each builds the call on a device with one rule broken; the message is the rule that must be named.
INVALID_CALLS = [
    pytest.param(lambda d: {**_call(device=d), "q": torch.ones(4, 2, 8, dtype=torch.int32, device=d)},
                 "q must be bfloat16, float16 or float32", id="int-q"),
    pytest.param(lambda d: {**_call(device=d), "q": _rows(4, 16, device=d)},
                 r"q must be \[tokens, heads, head_dim\]", id="q-rank"),
    pytest.param(lambda d: {**_call(device=d), "q": _heads(4, 2, 7, device=d)},
                 "head_dim must be positive and even", id="odd-head-dim"),
    pytest.param(lambda d: {**_call(device=d), "k": _heads(5, 1, 8, device=d)},
                 r"k must be \[4, kv_heads, 8\]", id="k-tokens"),
    pytest.param(lambda d: {**_call(device=d), "k": _heads(4, 1, 8, torch.float16, device=d)},
                 r"k must be \[4, kv_heads, 8\]", id="k-dtype"),
    pytest.param(lambda d: {**_call(device=d), "v": _heads(4, 1, 16, device=d)},
                 r"v must be \[4, kv_heads, 8\]", id="v-head-dim"),
    pytest.param(lambda d: {**_call(device=d), "v": _heads(4, 2, 8, device=d)},
                 "v must have k's 1 heads, got 2", id="v-heads"),
    pytest.param(lambda d: {**_call(device=d), "q": _heads(2, 4, 8, device=d).transpose(0, 1)},
                 "each token's heads of q must be contiguous", id="q-strided-heads"),
    pytest.param(lambda d: {**_call(device=d), "v": _rows(4, 16, device=d)[:, ::2].unsqueeze(1)},
                 "each token's heads of v must be contiguous", id="v-strided-elements"),
    pytest.param(lambda d: {**_call(device=d), "q_weight": _weight(8, torch.float16, device=d)},
                 "q_weight must have q's dtype", id="q-weight-dtype"),
    pytest.param(lambda d: {**_call(device=d), "k_weight": _weight(16, device=d)},
                 r"k_weight must have shape \[8\] \(k's last dim\)", id="k-weight-shape"),
    pytest.param(lambda d: {**_call(device=d), "cos": _tables(3, 8, device=d)[0]},
                 r"cos must be \[4, 8\]", id="cos-tokens"),
    pytest.param(lambda d: {**_call(device=d), "sin": _tables(4, 16, device=d)[1][:, ::2]},
                 "sin must be contiguous", id="sin-strided"),
    pytest.param(lambda d: {**_call(device=d), "k_prefix": _heads(3, 2, 8, device=d)},
                 r"k_prefix must be \[prefix, 1, 8\]", id="k-prefix-heads"),
    pytest.param(lambda d: {**_call(device=d), "k_prefix": _heads(3, 1, 8, torch.float32, device=d)},
                 r"k_prefix must be \[prefix, 1, 8\]", id="k-prefix-dtype"),
    pytest.param(lambda d: {**_call(device=d), "v_prefix": _heads(3, 2, 8, device=d)[:, :1]},
                 "v_prefix must be contiguous", id="v-prefix-strided"),
    pytest.param(lambda d: {**_call(device=d), "v_prefix": _heads(2, 1, 8, device=d)},
                 "v_prefix must have k_prefix's 3 tokens, got 2", id="prefix-tokens"),
]


def _reference_rope(x: torch.Tensor, weight: torch.Tensor, angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact norm of each head, then Llama's rotate-half RoPE in fp64: n * cos + rotate_half(n) * sin, with
    the tables' values (rounded to x's dtype) taken from the angles; and the sum of its terms' magnitudes."""
    n = _exact_norm(x, weight)
    half = x.shape[-1] // 2
    rotated = torch.cat([-n[..., half:], n[..., :half]], dim=-1)
    cos, sin = (f(angles).to(x.dtype).double()[:, None] for f in (torch.cos, torch.sin))
    return n * cos + rotated * sin, (n * cos).abs() + (rotated * sin).abs()


def _assert_is_norm_then_rotate_half(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                     angles: torch.Tensor) -> None:
    exact, terms = _reference_rope(x, weight, angles)
    error = (out.double() - exact).abs()
    # The result's rounding plus the normalized inputs' (16-bit: half an ulp each; fp32: the norm's few ulps),
    # scaled by the terms, which may cancel: a wrong sign or partner errs by the size of the terms themselves.
    # Against the exact norm: a reference rounded to x's dtype can round a near-tie the other way than the
    # kernel's fp32 value does, a whole ulp away (seen in fp16 at head_dim 128).
    u = UNIT_ROUNDOFF[x.dtype]
    inputs = 8 * u if x.dtype == torch.float32 else 1.01 * u
    assert (error <= u * exact.abs() + inputs * terms).all()


# --- CPU ---

@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("fused", [False, True], ids=["split-qkv", "fused-qkv"])
def test_opcheck_attention_inputs(fused, prefix):
    opcheck(torch.ops.cosmos3.attention_inputs.default,
            tuple(_call(5, 4, 2, 32, prefix, fused=fused).values()))


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(("make", "message"), INVALID_CALLS)
def test_every_attention_inputs_rule_is_named(make, message, device):
    with pytest.raises(ValueError, match=message):
        ops.attention_inputs(**make(device))


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_q_and_k_are_norm_then_rotate_half_after_the_prefixes(head_dim, dtype, prefix):
    tokens = 40
    call = _call(tokens, 4, 2, head_dim, prefix, dtype, fused=False)
    q, k, v = ops.attention_inputs(**call)
    assert q.shape == (tokens, 4, head_dim) and k.shape == v.shape == (prefix + tokens, 2, head_dim)
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    angles = _angles(tokens, head_dim)
    _assert_is_norm_then_rotate_half(q, call["q"], call["q_weight"], angles)
    _assert_is_norm_then_rotate_half(k[prefix:], call["k"], call["k_weight"], angles)
    assert_same_bits(k[:prefix], call["k_prefix"])
    assert_same_bits(v, torch.cat([call["v_prefix"], call["v"]]))


@pytest.mark.parametrize("prefix", PREFIXES)
def test_strided_tokens_read_as_their_contiguous_copy(prefix):
    call = _call(9, 4, 2, 32, prefix)  # q, k, v: column slices of one fused QKV output
    assert call["q"].stride() == ((4 + 2 * 2) * 32, 32, 1) and call["v"].stride() == call["q"].stride()
    copied = {**call, **{name: call[name].contiguous() for name in ("q", "k", "v")}}
    for got, want in zip(ops.attention_inputs(**call), ops.attention_inputs(**copied), strict=True):
        assert_same_bits(got, want)


def test_no_gen_tokens_gives_the_prefixes_back():
    call = _call(0, 4, 2, 32, prefix=6)
    q, k, v = ops.attention_inputs(**call)
    assert q.shape == (0, 4, 32)
    assert_same_bits(k, call["k_prefix"])
    assert_same_bits(v, call["v_prefix"])


class _Recorded:
    """Stands in for AttentionKernels: keeps each tower's q, k, v and answers zeros ``[S, nh * hd]``."""

    def __init__(self):
        self.seen = {}

    def und(self, q, k, v):
        self.seen["und"] = (q, k, v)
        return q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])

    def gen(self, q, k, v, skip=None):
        assert skip is None  # eager passes hand the kernel the prompt's rows only
        self.seen["gen"] = (q, k, v)
        return q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])


def _tower_qkv(attention: MoTAttention, tower, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A tower's projections of ``x`` ``[S, H]``, each ``[S, heads, hd]``."""
    if attention.split_qkv:
        q, k, v = (getattr(attention, name)(x) for name in (tower.q, tower.k, tower.v))
    else:
        fused = getattr(attention, tower.fused_qkv)
        q, k, v = fused(x).split(fused.shard_sizes, dim=-1)
    return tuple(t.reshape(x.shape[0], -1, attention.head_dim) for t in (q, k, v))


@pytest.mark.parametrize("split_qkv", [True, False], ids=["split-qkv", "fused-qkv"])
def test_mot_attention_hands_its_kernels_what_the_four_ops_made(split_qkv):
    # UND: its own q, k, v (no prefix); GEN: q, then [k_und ; k_gen] and [v_und ; v_gen], as rms_norm_rope twice
    # and two torch.cat made them.
    def linear(name, in_features, out_features, shard_keys=None):
        return Linear(in_features, out_features, quant_method=UNQUANTIZED, dtype=torch.bfloat16, shard_keys=shard_keys)

    recorded = _Recorded()
    attention = MoTAttention(hidden_size=24, num_heads=4, num_kv_heads=2, head_dim=8, eps=EPS, split_qkv=split_qkv,
                             make_linear=linear, dtype=torch.bfloat16, kernels=recorded)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in attention.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3 + (1.0 if param.dim() == 1 else 0.0))
    x_und, x_gen = _rows(6, 24, seed=1), _rows(10, 24, seed=2)
    (cos_und, sin_und), (cos_gen, sin_gen) = _tables(6, 8), _tables(10, 8)
    _, k_und, v_und = attention.und(x_und, cos_und, sin_und)
    attention.gen(x_gen, cos_gen, sin_gen, k_und, v_und)

    expected = {}
    for name, tower, x, cos, sin in (("und", UND, x_und, cos_und, sin_und), ("gen", GEN, x_gen, cos_gen, sin_gen)):
        q, k, v = _tower_qkv(attention, tower, x)
        expected[name] = (ops_cpu.rms_norm_rope(q, getattr(attention, tower.norm_q).weight, EPS, cos, sin),
                          ops_cpu.rms_norm_rope(k, getattr(attention, tower.norm_k).weight, EPS, cos, sin), v)
    expected["gen"] = (expected["gen"][0], torch.cat([expected["und"][1], expected["gen"][1]]),
                       torch.cat([expected["und"][2], expected["gen"][2]]))
    assert_same_bits(k_und, expected["und"][1])
    assert_same_bits(v_und, expected["und"][2].contiguous())
    for name in ("und", "gen"):
        for got, want in zip(recorded.seen[name], expected[name], strict=True):
            assert_same_bits(got, want.contiguous())


# --- GPU ---

def _poisoned_cuda_outputs(q: torch.Tensor, k: torch.Tensor, prefix: int) -> None:
    """Leaves blocks of the outputs' sizes filled with NaN bits in the caching allocator, where the op's outputs
    will land: an element the kernel fails to write reads as NaN, not as a previous run's right answer."""
    kv_shape = (prefix + k.shape[0], *k.shape[1:])
    for shape in (q.shape, kv_shape, kv_shape):
        torch.full(shape, -1, dtype=torch.int16 if q.element_size() == 2 else torch.int32, device="cuda")


def _cuda_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the same view of a CUDA copy of its storage: strides, storage offset and so alignment kept."""
    storage = t.untyped_storage().cuda()
    return torch.empty(0, dtype=t.dtype, device="cuda").set_(storage, t.storage_offset(), t.shape, t.stride())


def _assert_gpu_matches_cpu(call: dict) -> None:
    """attention_inputs on CUDA views like ``call``'s gives the CPU impl's outputs, bit for bit."""
    on_gpu = {name: _cuda_view(t) if isinstance(t, torch.Tensor) else t for name, t in call.items()}
    _poisoned_cuda_outputs(on_gpu["q"], on_gpu["k"], call["k_prefix"].shape[0])
    for gpu, cpu in zip(ops.attention_inputs(**on_gpu), ops.attention_inputs(**call), strict=True):
        assert_same_bits(gpu.cpu(), cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("prefix", [pytest.param(0, id="und-tower"), pytest.param(40, id="gen-after-und")])
@pytest.mark.parametrize("fused", [False, True], ids=["split-qkv", "fused-qkv"])
@pytest.mark.parametrize("dtype", DTYPES)
# The kernel's three row paths: a chunk a lane with the partner by shuffle (128, 64), whole partner chunks
# reloaded (48: 6 chunks on 8 lanes; 512: 64 lanes, two warps) and element by element (8, 6).
@pytest.mark.parametrize("head_dim", [512, 48, *HEAD_DIMS])
def test_gpu_attention_inputs_matches_cpu_bit_for_bit(head_dim, dtype, fused, prefix):
    # 333 tokens of 6 query and 2 KV heads: 1,998 and 666 rows, neither a multiple of a block's 4 (head_dim 512),
    # 16, 32 or 256 rows, so q's and k's last blocks are partial and k's rows and the copies start after them.
    _assert_gpu_matches_cpu(_call(333, 6, 2, head_dim, prefix, dtype, fused=fused, scale=3.0))


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["split-qkv", "fused-qkv"])
def test_gpu_nano_still_layer_matches_cpu_bit_for_bit(fused):
    # A GEN layer of a still: 1,024 tokens, 32 query and 8 KV heads of 128, after 40 UND tokens.
    _assert_gpu_matches_cpu(_call(1024, 32, 8, 128, 40, fused=fused, scale=3.0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_no_gen_tokens_copies_the_prefixes(dtype):
    _assert_gpu_matches_cpu(_call(0, 8, 2, 128, 40, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("off", ["q", "v_prefix"])
def test_gpu_inputs_off_a_16_byte_boundary_take_the_element_path(off):
    # q 2 bytes off: the norms' element path beside the copies' vectors; v_prefix: the copies' element path
    # beside the norms' vectors.
    call = _call(64, 8, 2, 128, 40)
    buf = torch.empty(1 + call[off].numel(), dtype=call[off].dtype)
    call[off] = buf[1:].view(call[off].shape).copy_(call[off])
    _assert_gpu_matches_cpu(call)


@pytest.mark.gpu
@pytest.mark.parametrize(("make", "message"), INVALID_CALLS)
def test_gpu_every_attention_inputs_rule_is_named(make, message):
    with pytest.raises(ValueError, match=message):
        ops.attention_inputs(**make("cuda"))


@pytest.mark.gpu
def test_gpu_prefix_on_another_device_is_rejected():
    with pytest.raises(ValueError, match=r"k_prefix must be \[prefix, 1, 8\] .* on cuda"):
        ops.attention_inputs(**{**_call(device="cuda"), "k_prefix": _heads(3, 1, 8)})


@pytest.mark.gpu
@pytest.mark.parametrize("prefix", PREFIXES)
def test_gpu_opcheck_attention_inputs(prefix):
    opcheck(torch.ops.cosmos3.attention_inputs.default, tuple(_call(33, 8, 2, 128, prefix, device="cuda").values()))


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_reads_inputs_and_prefixes_updated_in_place():
    call = _call(256, 8, 2, 128, 40, device="cuda", fused=False)
    ops.attention_inputs(**call)  # loads the kernels before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.attention_inputs(**call)
    fresh = _call(256, 8, 2, 128, 40, device="cuda", seed=7, fused=False)
    for name in ("q", "k", "v", "k_prefix", "v_prefix"):
        call[name].copy_(fresh[name])
    graph.replay()
    expected = ops.attention_inputs(**{name: t.cpu() if isinstance(t, torch.Tensor) else t
                                       for name, t in call.items()})
    for g, c in zip(out, expected, strict=True):
        assert_same_bits(g.cpu(), c)
