"""Attention kernels of the MoT layers, one choice per model: on Hopper FlashAttention-3 (BF16 and FP8), from
the prebuilt fa3-fwd wheel or FlashInfer, where installed; else torch SDPA (cuDNN backend) for BF16 and
cuDNN's ``sdpa_fp8`` for FP8.

Every kernel maps ``q [Sq, nh, hd]``, ``k/v [Sk, nkv, hd]`` (GQA, ``nh % nkv == 0``) to ``[Sq, nh*hd]``
with softmax scale ``1/sqrt(hd)``; the token-major layout goes to the kernels as strides, never copied.

FP8 recipe (``fp8_inputs``), computed from the tensors of this call, so no calibration data exists:
keys and values are smoothed, their mean over tokens subtracted (exact: softmax ignores the per-query
constant ``q . m_k``, and every softmax row sums to 1, so ``m_v`` is added back to the output);
then Q, K and V each get one power-of-two scale ``2^ceil(log2(amax/448))`` and go through the
project's saturating ``quantize_fp8``. Powers of two make every descale exact in any dtype. Inside
the kernel the probabilities P (<= 1 against the running row max) are FP8 with scale 1/448; on
Hopper cuDNN also writes O as FP8 (|O| <= max|V|, so O's scale is V's), which we dequantize.
``fp8_attention_reference`` is the same arithmetic in plain fp32 torch ops (CPU or GPU).

bench_attention.py measured the candidates on the H200 at 44,160 x 44,672: FA3's kernels are the fastest,
fa3-fwd 0.0.3's (BF16 666 TFLOP/s vs cuDNN's 623 in the same run; FP8 894 at 1.6% relative L2 vs cuDNN's 788
at 2.0%) a little ahead of FlashInfer 0.7.4's (663 and 847, another run); at 1,024 x 1,536 FlashInfer's BF16
kernel took 0.068 ms vs cuDNN's 0.097 (benchmarks/results/h200-attention.md). Smoothing V is what makes cuDNN's
FP8 usable there: without it the error grows with the key count (3.8% relative L2 at 1,536 keys, 31% at
44,672, where the emulation stays at 3%), with it 2.0%. FA3 is Hopper-only (sm_90a): Blackwell runs cuDNN.
"""

from __future__ import annotations

import math

import structlog
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cosmos3.errors import ConfigError
from cosmos3.ops import FP8, FP8_MAX, quantize_fp8
from cosmos3.quant.step_precision import StepPrecision
from cosmos3.rules.attention_choice import FP8_CHOICES, check_attention, fp8_on_step

log = structlog.get_logger(__name__)

P_SCALE = FP8_MAX  # P in [0, 1] is stored as P * 448 in FP8


# ------------------------------------------------------------------ FP8 quantization (shared by every path)

def smooth_keys(k: torch.Tensor) -> torch.Tensor:
    """``k [Sk, nkv, hd]`` minus its mean over tokens (per head and channel); attention is unchanged."""
    return k - k.mean(dim=0, keepdim=True, dtype=torch.float32).to(k.dtype)


def power_of_two_scale(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``[1]`` device tensor ``2^ceil(log2(amax(x) / 448))``: ``x / scale`` fits FP8 e4m3, no host sync."""
    amax = torch.linalg.vector_norm(x, float("inf")).float().clamp_min(2.0**-100).reshape(1)
    return torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))


def fp8_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, smooth_k: bool = True, smooth_v: bool = True):
    """``(q8, k8, v8), (sq, sk, sv), v_mean``: FP8 tensors in the input layouts, their fp32 ``[1]`` dequant
    scales, and V's mean ``[1, nkv, hd]`` that the output gets back (None when ``smooth_v`` is off).

    The switches exist to measure what smoothing buys (bench_attention.py); the kernels smooth both.
    """
    k = smooth_keys(k) if smooth_k else k
    v_mean = v.mean(dim=0, keepdim=True, dtype=torch.float32).to(v.dtype) if smooth_v else None
    v = v - v_mean if smooth_v else v
    scales = tuple(power_of_two_scale(t) for t in (q, k, v))
    return tuple(quantize_fp8(t.contiguous(), s) for t, s in zip((q, k, v), scales, strict=True)), scales, v_mean


def add_value_mean(out: torch.Tensor, v_mean: torch.Tensor | None, group: int) -> torch.Tensor:
    """``out [Sq, nh*hd]`` plus V's mean under each query head (head h reads KV head h // group)."""
    return out if v_mean is None else out + v_mean.repeat_interleave(group, dim=1).reshape(1, -1)


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """fp32 attention with no quantization, the reference every kernel is measured against; ``[Sq, nh*hd]``."""
    q, k, v = (t.float() for t in (q, k, v))
    return _attention_f32(q, k, v, causal=causal, p_fp8=False).reshape(q.shape[0], -1)


def fp8_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                            fp8_output: bool, smooth_k: bool = True, smooth_v: bool = True,
                            rows: torch.Tensor | None = None) -> torch.Tensor:
    """The FP8 kernel's arithmetic in fp32 torch ops: quantized Q/K/V, P in FP8, O in FP8 if ``fp8_output``.

    P is taken against the exact row max (a flash kernel uses a running max, which only makes its
    early P values smaller). ``rows`` (query indices, non-causal only) limits the output to those
    queries, quantized with the whole tensor's scale. ``[Sq or len(rows), nh*hd]`` in ``q``'s dtype.
    """
    (q8, k8, v8), (sq, sk, sv), v_mean = fp8_inputs(q, k, v, smooth_k=smooth_k, smooth_v=smooth_v)
    if rows is not None:
        q8 = q8[rows]
    out = _attention_f32(q8.float() * sq, k8.float() * sk, v8.float() * sv, causal=causal, p_fp8=True)
    if fp8_output:
        out = quantize_fp8(out.contiguous(), sv).float() * sv
    out = out.to(q.dtype).reshape(q8.shape[0], -1)
    return add_value_mean(out, v_mean, q.shape[1] // k.shape[1])


def _attention_f32(q, k, v, *, causal: bool, p_fp8: bool) -> torch.Tensor:
    """fp32 ``q [Sq, nh, hd]``, ``k/v [Sk, nkv, hd]`` -> ``[Sq, nh, hd]``; the whole score matrix at once."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [Sk, nh, hd]
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])  # [nh, Sq, Sk]
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    p = torch.exp(scores - scores.amax(dim=-1, keepdim=True))  # <= 1
    total = p.sum(dim=-1, keepdim=True)  # the row sum of the unrounded P, as a flash kernel keeps it
    if p_fp8:
        p = (p * P_SCALE).to(FP8).float() / P_SCALE
    return torch.einsum("hqk,khd->qhd", p / total, v)


# ------------------------------------------------------------------ kernels

_TORCH_ORDER = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


class SdpaKernel:
    """torch's SDPA with ``backend`` first (or torch's own dispatch when it is None, as on CPU).

    ``pinned``: that backend only (benchmarks and tests); otherwise the others follow it in torch's
    order, so a shape it does not support (the toy model's head_dim 8) still runs.
    """

    def __init__(self, backend: SDPBackend | None, *, pinned: bool = False):
        self.name = "sdpa" if backend is None else f"sdpa-{backend.name.lower().replace('_attention', '')}"
        self.backends = None if backend is None else [backend] + ([] if pinned else
                                                                  [b for b in _TORCH_ORDER if b != backend])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
        q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, S, hd] views
        if self.backends is None:
            out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, enable_gqa=True)
        else:
            with sdpa_kernel(self.backends, set_priority=True):
                out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, enable_gqa=True)
        return out.squeeze(0).transpose(0, 1).reshape(q.shape[0], -1)  # [1, nh, Sq, hd] -> [Sq, nh*hd]


class Fp8ReferenceKernel:
    """``fp8_attention_reference`` as a kernel (CPU only: it holds the whole score matrix); Hopper's FP8 O."""

    name = "fp8-reference"
    min_queries = 0

    def __call__(self, q, k, v, *, causal: bool) -> torch.Tensor:
        return fp8_attention_reference(q, k, v, causal=causal, fp8_output=True)


class CudnnFp8Kernel:
    """cuDNN frontend ``sdpa_fp8`` on Hopper/Blackwell: one cuDNN graph per shape, built on first use.

    ``smooth_values=False`` only to measure the kernel without V smoothing (bench_attention.py).
    """

    name = "cudnn-fp8"
    # Below this many queries FP8 costs more than it saves (quantizing Q/K/V, the FP8 O pass): on the H200
    # it was 0.86x of the step at 1,024 GEN tokens, level at 8,192, 1.37x faster alone at 16,384
    # (benchmarks/results/h200-attention.md).
    min_queries = 16384

    def __init__(self, *, smooth_values: bool = True):
        import cudnn  # nvidia-cudnn-frontend

        self._cudnn = cudnn
        self.smooth_values = smooth_values
        self._handles: dict[int, object] = {}
        self._plans: dict[tuple, _CudnnFp8Plan] = {}

    def __call__(self, q, k, v, *, causal: bool) -> torch.Tensor:
        (q8, k8, v8), (sq, sk, sv), v_mean = fp8_inputs(q, k, v, smooth_v=self.smooth_values)
        key = (tuple(q.shape), tuple(k.shape), causal, q.device.index)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _CudnnFp8Plan(self._cudnn, self._handle(q.device), q8, k8, causal)
        out = plan.run(q8, k8, v8, sq, sk, sv, out_dtype=q.dtype)  # [Sq, nh*hd]
        return add_value_mean(out, v_mean, q.shape[1] // k.shape[1])

    def _handle(self, device: torch.device):
        if device.index not in self._handles:
            with torch.cuda.device(device):
                self._handles[device.index] = self._cudnn.create_handle()
        return self._handles[device.index]


class _CudnnFp8Plan:
    """One built cuDNN FP8 SDPA graph. Hopper wants FP8 O and may want as many K/V heads as Q heads:
    the variants are tried in order of preference at build time, and the first cuDNN supports is kept."""

    def __init__(self, cudnn, handle, q8: torch.Tensor, k8: torch.Tensor, causal: bool, stats: bool = False):
        self.cudnn, self.handle, self.stats = cudnn, handle, stats
        self.key = f"q{list(q8.shape)} k{list(k8.shape)} causal={causal}"
        device = q8.device
        self.descale_s = torch.full((1, 1, 1, 1), 1.0 / P_SCALE, device=device)
        self.scale_s = torch.full((1, 1, 1, 1), P_SCALE, device=device)
        self.one = torch.ones((1, 1, 1, 1), device=device)
        self.amax = torch.empty((2, 1, 1, 1, 1), device=device)  # amax(S), amax(O): outputs nobody reads
        errors = []
        for bf16_out, expand_kv in ((True, False), (False, False), (True, True), (False, True)):
            try:
                self._build(q8, k8, causal, bf16_out, expand_kv)
                break
            except Exception as err:  # noqa: BLE001 - cuDNN reports "not supported" with several types
                errors.append(f"bf16 O={bf16_out}, expanded K/V={expand_kv}: {type(err).__name__}: {err}")
        else:
            raise RuntimeError(f"cuDNN sdpa_fp8 supports none of our layouts for {self.key}:\n  " + "\n  ".join(errors))
        self.bf16_out, self.expand_kv = bf16_out, expand_kv

    def _build(self, q8, k8, causal: bool, bf16_out: bool, expand_kv: bool) -> None:
        cudnn = self.cudnn
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32,
                              handle=self.handle)
        sq, nh, hd = q8.shape
        sk, nkv = k8.shape[0], nh if expand_kv else k8.shape[1]

        def bhsd(name, s, h, dtype=e4m3):  # token-major [S, H, D] memory seen as [1, H, S, D]
            return graph.tensor(name=name, dim=[1, h, s, hd], stride=[s * h * hd, hd, h * hd, 1], data_type=dtype)

        scalar = dict(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
        q, k, v = bhsd("q", sq, nh), bhsd("k", sk, nkv), bhsd("v", sk, nkv)
        scales = [graph.tensor(name=n, **scalar) for n in ("descale_q", "descale_k", "descale_v", "descale_s",
                                                          "scale_s", "scale_o")]
        o, lse, amax_s, amax_o = graph.sdpa_fp8(q=q, k=k, v=v, descale_q=scales[0], descale_k=scales[1],
                                              descale_v=scales[2], descale_s=scales[3], scale_s=scales[4],
                                              scale_o=scales[5], generate_stats=self.stats,
                                              attn_scale=1.0 / math.sqrt(hd), use_causal_mask=causal, name="sdpa")
        o.set_output(True).set_dim([1, nh, sq, hd]).set_stride([sq * nh * hd, hd, nh * hd, 1]).set_data_type(
            cudnn.data_type.BFLOAT16 if bf16_out else e4m3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
        if self.stats:  # log-sum-exp of each query row's scaled scores, [1, nh, sq, 1]
            lse.set_output(True).set_dim([1, nh, sq, 1]).set_stride([nh * sq, sq, 1, 1]).set_data_type(f32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        self.graph, self.tensors = graph, (q, k, v, *scales, o, amax_s, amax_o) + ((lse,) if self.stats else ())
        self.workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=q8.device)

    def run(self, q8, k8, v8, sq, sk, sv, *, out_dtype: torch.dtype) -> torch.Tensor:
        if self.expand_kv:
            group = q8.shape[1] // k8.shape[1]
            k8, v8 = (t.repeat_interleave(group, dim=1) for t in (k8, v8))
        out = torch.empty(q8.shape, dtype=torch.bfloat16 if self.bf16_out else FP8, device=q8.device)
        scale_o = self.one if self.bf16_out else (1.0 / sv).reshape(1, 1, 1, 1)
        data = (q8, k8, v8, sq.reshape(1, 1, 1, 1), sk.reshape(1, 1, 1, 1), sv.reshape(1, 1, 1, 1),
                self.descale_s, self.scale_s, scale_o, out, self.amax[0], self.amax[1])
        if self.stats:
            self.lse = torch.empty((1, q8.shape[1], q8.shape[0], 1), device=q8.device)
            data += (self.lse,)
        self.cudnn.set_stream(self.handle, torch.cuda.current_stream(q8.device).cuda_stream)
        self.graph.execute(dict(zip(self.tensors, data, strict=True)), self.workspace, handle=self.handle)
        if not self.bf16_out:  # O was stored as O / sv; sv is a power of two, exact in bf16
            out = out.to(out_dtype) * sv.to(out_dtype)
        return out.reshape(q8.shape[0], -1).to(out_dtype)


class _Fa3Family:
    """What FA3-based kernels share: BF16 straight through, or FP8 by the recipe above, whose one scale per
    tensor goes to the kernel as per-head descales; O comes back in BF16 (FA3 writes BF16 O on Hopper).
    A subclass sets ``head_dims`` and the two calls on token-major tensors: ``_bf16(q, k, v, causal)`` and
    ``_fp8(q8, k8, v8, (sq, sk, sv), causal, out_dtype)``, each returning ``[Sq, nh, hd]``."""

    # cuDNN FP8's measured crossover; FA3 FP8 is no cheaper below it (1,024 queries: 0.403 ms, BF16 FA3 0.068).
    min_queries = CudnnFp8Kernel.min_queries
    head_dims: tuple[int, ...] = ()
    skips_rows = False  # whether ``skipping`` runs (Fa3Kernel's BF16 kernel)
    skip_failure: str | None = None  # why ``skipping`` could not run here, where it should have

    def __call__(self, q, k, v, *, causal: bool) -> torch.Tensor:
        if not self.fp8:
            return self._bf16(q, k, v, causal).reshape(q.shape[0], -1)
        (q8, k8, v8), scales, v_mean = fp8_inputs(q, k, v)
        out = self._fp8(q8, k8, v8, scales, causal, q.dtype)  # [Sq, nh, hd]
        return add_value_mean(out.reshape(q.shape[0], -1), v_mean, q.shape[1] // k.shape[1])

    def prepare(self, device: torch.device, head_dim: int) -> None:
        """Load (or build) the kernel for ``head_dim`` now, at model load, with one small call; raises where it
        cannot run here (a library that does not load, no nvcc for a JIT, an unsupported head_dim)."""
        if head_dim not in self.head_dims:
            raise ValueError(f"{self.name} has kernels for head_dim {self.head_dims}, not {head_dim}")
        q = torch.randn(128, 1, head_dim, device=device, dtype=torch.bfloat16)
        self(q, q, q, causal=False)
        if self.skips_rows:
            try:
                self.skipping(q, q, q, torch.zeros(1, dtype=torch.int32, device=device))
            except Exception as err:  # noqa: BLE001 - a build without FA3's varlen kernels, say
                # Still the fastest kernel; CUDA graphs then hold one prompt length each.
                self.skips_rows = False
                self.skip_failure = _first_line(err)
                log.warning("attention kernel cannot skip K/V rows here", kernel=self.name, reason=self.skip_failure)


class Fa3Kernel(_Fa3Family):
    """FlashAttention-3's own Hopper kernels, prebuilt: the ``fa3-fwd`` wheel (forward only, sm_90a, CUDA 13),
    so no JIT and no CUDA toolkit on the node. Its FP8 descales are ``[batch, nkv]``."""

    head_dims = (64, 96, 128, 192, 256)

    def __init__(self, *, fp8: bool):
        # loads the kernels; fails here if they cannot run
        from fa3_fwd_interface import flash_attn_func, flash_attn_with_kvcache

        self._attention, self._over_cache = flash_attn_func, flash_attn_with_kvcache
        self.fp8 = fp8
        self.name = "fa3-fp8" if fp8 else "fa3"
        self.skips_rows = not fp8  # FP8's smoothing would average the skipped rows too

    def _bf16(self, q, k, v, causal):
        return self._attention(q[None], k[None], v[None], causal=causal)[0]  # [1, S, heads, hd] views

    def skipping(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        """BF16, non-causal: ``q [Sq, nh, hd]`` over the rows of ``k/v [Sk, nkv, hd]`` from ``skip`` (int32 [1] on
        the device) on, read there by the kernel (FA3's left padding of a KV cache): ``[Sq, nh*hd]``."""
        return self._over_cache(q[None], k[None], v[None], cache_leftpad=skip)[0].reshape(q.shape[0], -1)

    def _fp8(self, q8, k8, v8, scales, causal, out_dtype):
        descales = {f"{name}_descale": s.reshape(1, 1).expand(1, k8.shape[1]).contiguous()  # [1, nkv] fp32
                    for name, s in zip("qkv", scales, strict=True)}
        return self._attention(q8[None], k8[None], v8[None], causal=causal, **descales)[0].to(out_dtype)


class FlashInferKernel(_Fa3Family):
    """FlashInfer's FA3 prefill kernel for one sequence (sm_90), BF16 or FP8 (its descales are per head).
    FlashInfer compiles the kernel on first use (its JIT needs nvcc) unless its prebuilt
    ``flashinfer-jit-cache`` matches."""

    head_dims = (64, 128, 256)

    def __init__(self, *, fp8: bool):
        import flashinfer

        self._prefill = flashinfer.single_prefill_with_kv_cache
        self.fp8 = fp8
        self.name = "flashinfer-fa3-fp8" if fp8 else "flashinfer-fa3"

    def _bf16(self, q, k, v, causal):
        return self._prefill(q, k, v, causal=causal, backend="fa3")

    def _fp8(self, q8, k8, v8, scales, causal, out_dtype):
        heads = (q8.shape[1], k8.shape[1], v8.shape[1])
        per_head = {f"scale_{name}": s.expand(n).contiguous()  # [heads] fp32
                    for name, s, n in zip("qkv", scales, heads, strict=True)}
        return self._prefill(q8, k8, v8, **per_head, o_dtype=out_dtype, causal=causal, backend="fa3")


# ------------------------------------------------------------------ the choice

def _fa3_names(capability: tuple[int, int] | None, fa3: bool, flashinfer: bool) -> list[str]:
    """The FA3 kernels installed, fastest first (their BF16 names); FA3 runs on Hopper (sm_90a) only.
    ``fa3``: the prebuilt ``fa3-fwd`` wheel; ``flashinfer``: flashinfer-python (JIT-compiled FA3)."""
    if capability != (9, 0):
        return []
    return [name for name, installed in (("fa3", fa3), ("flashinfer-fa3", flashinfer)) if installed]


def bf16_kernel_names(device_type: str, capability: tuple[int, int] | None, cudnn_available: bool,
                      flashinfer: bool, *, fa3: bool = False) -> list[str]:
    """The BF16 kernels for a device, fastest first (bench_attention.py on the H200 at 44,160 tokens:
    fa3-fwd 666, FlashInfer FA3 663, SDPA cuDNN 623, SDPA flash 354 TFLOP/s); torch's own
    dispatch off CUDA."""
    if device_type != "cuda":
        return ["sdpa"]
    names = _fa3_names(capability, fa3, flashinfer)
    if capability is not None and capability >= (9, 0) and cudnn_available:
        names.append("sdpa-cudnn")
    return names + ["sdpa-flash"]


def fp8_kernel_names(device_type: str, capability: tuple[int, int] | None, cudnn_frontend: bool,
                     flashinfer: bool, *, fa3: bool = False) -> list[str]:
    """The FP8 kernels for a device, fastest first: FA3's on sm_90 (on the H200: fa3-fwd 894,
    FlashInfer 847, cuDNN 788-799 TFLOP/s), ``cudnn-fp8`` on sm_90+ with nvidia-cudnn-frontend (cuDNN also serves
    FP8 SDPA on Blackwell, with BF16 O; not yet measured there); the fp32 reference math on CPU."""
    if device_type == "cpu":
        return ["fp8-reference"]
    if device_type != "cuda" or capability is None or capability < (9, 0):
        raise ConfigError(f"attention='fp8' needs an sm_90+ (Hopper or Blackwell) GPU, got {device_type} "
                          f"with compute capability {capability}; use attention='auto'")
    names = [f"{name}-fp8" for name in _fa3_names(capability, fa3, flashinfer)]
    if cudnn_frontend:
        names.append("cudnn-fp8")
    if not names:
        raise ConfigError("attention='fp8' runs FA3's FP8 attention (Hopper: fa3-fwd or flashinfer-python) or cuDNN's "
                          "(nvidia-cudnn-frontend), and none is installed: pip install 'cosmos3-farm[fa3]' (Hopper) or "
                          "'cosmos3-farm[fp8-attention]', or use attention='auto'")
    return names


def _first_line(err: Exception) -> str:
    """``Type: first line of the message`` (at most 200 characters of it), for logs and sidecars."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"


def _device_facts(device: torch.device) -> tuple[str, tuple[int, int] | None]:
    if device.type != "cuda":
        return device.type, None
    return "cuda", torch.cuda.get_device_capability(device)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _make_kernel(name: str):
    if name in ("fa3", "fa3-fp8"):
        return Fa3Kernel(fp8=name.endswith("fp8"))
    if name.startswith("flashinfer-fa3"):
        return FlashInferKernel(fp8=name.endswith("fp8"))
    if name == "cudnn-fp8":
        return CudnnFp8Kernel()
    if name == "fp8-reference":
        return Fp8ReferenceKernel()
    return SdpaKernel(_BF16_KERNELS[name])


_BF16_KERNELS = {"sdpa": None, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}


class AttentionKernels:
    """The kernels of one model, shared by its layers: BF16 always, FP8 for GEN when ``choice`` is one of
    ``FP8_CHOICES``.

    ``step_precision`` is the model's (``cosmos3.quant.step_precision``; ``precise`` reads it): under ``fp8`` the
    W8A16 edge steps run BF16 attention too (``fp8-all-steps`` keeps FP8 there), and so does a GEN pass shorter
    than the FP8 kernel's ``min_queries`` (where FP8 would be slower). UND attention is always BF16: it runs once per
    prompt (its K/V are cached for every step, so its error would reach all of them) and is about
    1% of one GEN step.
    """

    def __init__(self, choice: str = "auto", head_dim: int = 128, step_precision: StepPrecision | None = None):
        self.choice = check_attention(choice)
        self.head_dim = head_dim
        self.step_precision = step_precision or StepPrecision()
        self._kernels: dict[tuple, object] = {}
        # kernel name -> why it cannot run here (a faster one, skipped); "NAME row skipping" -> why NAME runs without
        self._passed_over: dict[str, str] = {}

    def use(self, choice: str) -> None:
        """Switch a loaded model's choice (benchmarks compare kernels on one set of weights)."""
        self.choice = check_attention(choice)

    def check_device(self, device: torch.device | str) -> None:
        """Pick (and build) the kernels now, at load time: an unusable choice fails here, not in the first step,
        and a kernel library's JIT compilation is part of the load, not of a job."""
        device = torch.device(device)
        self._kernel(device, fp8=False)
        if self.choice in FP8_CHOICES:
            self._kernel(device, fp8=True)

    def gen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        """GEN queries over ``[K_und ; K_gen]``, unmasked; the first ``skip`` rows (int32 [1] on the device, only
        where ``gen_skips_rows`` says the kernel can) are left out."""
        kernel = self._gen_kernel(q.device, q.shape[0])
        return kernel(q, k, v, causal=False) if skip is None else kernel.skipping(q, k, v, skip)

    def gen_skips_rows(self, device: torch.device | str, queries: int) -> bool:
        """Whether the GEN kernel a pass of ``queries`` tokens runs now reads a row count to skip from the device
        (a CUDA graph then serves prompts of any length up to its K/V rows). FA3's BF16 kernel does."""
        return getattr(self._gen_kernel(torch.device(device), queries), "skips_rows", False)

    def und(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._kernel(q.device, fp8=False)(q, k, v, causal=True)

    @property
    def precise(self) -> bool:
        """Whether this step runs at 16 bits (the model's step precision says so)."""
        return self.step_precision.a16

    @precise.setter
    def precise(self, a16: bool) -> None:
        self.step_precision.a16 = a16

    @property
    def fp8_active(self) -> bool:
        return fp8_on_step(self.choice, self.precise)

    def gen_kernel(self, device: torch.device | str, queries: int) -> str:
        """The name of the kernel a GEN pass of ``queries`` tokens on ``device`` runs now."""
        return self._gen_kernel(torch.device(device), queries).name

    def _gen_kernel(self, device: torch.device, queries: int):
        if self.fp8_active:
            fp8 = self._kernel(device, fp8=True)
            if queries >= fp8.min_queries:
                return fp8
        return self._kernel(device, fp8=False)

    def describe(self, device: torch.device | str) -> dict:
        device = torch.device(device)
        info = {"choice": self.choice, "bf16_kernel": self._kernel(device, fp8=False).name}
        if self.choice in FP8_CHOICES:
            info["fp8_kernel"] = self._kernel(device, fp8=True).name
        if self._passed_over:
            info["passed_over"] = dict(self._passed_over)
        return info

    def _kernel(self, device: torch.device, *, fp8: bool):
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = (device.type, device.index, fp8)
        if key not in self._kernels:
            device_type, capability = _device_facts(device)
            flashinfer = self.head_dim in FlashInferKernel.head_dims and _installed("flashinfer")
            fa3 = self.head_dim in Fa3Kernel.head_dims and _installed("fa3_fwd_interface")
            if fp8:
                names = fp8_kernel_names(device_type, capability, _installed("cudnn"), flashinfer, fa3=fa3)
            else:
                names = bf16_kernel_names(device_type, capability, torch.backends.cudnn.is_available(), flashinfer,
                                          fa3=fa3)
            self._kernels[key] = self._first_that_runs(names, device)
        return self._kernels[key]

    def _first_that_runs(self, names: list[str], device: torch.device):
        """The first of ``names`` that builds here. A library kernel that cannot (FlashInfer without nvcc for
        its JIT, say) is logged and recorded, and the next one is tried; when none is left, a ConfigError."""
        for name in names:
            try:
                kernel = _make_kernel(name)
                if hasattr(kernel, "prepare"):
                    kernel.prepare(device, self.head_dim)
                if getattr(kernel, "skip_failure", None):  # it runs, but its graphs hold one prompt length each
                    self._passed_over[f"{kernel.name} row skipping"] = kernel.skip_failure
                return kernel
            except Exception as err:  # noqa: BLE001 - an import, JIT or library failure of any type
                self._passed_over[name] = _first_line(err)
                log.warning("attention kernel unavailable here", kernel=name, reason=self._passed_over[name])
        raise ConfigError(f"attention={self.choice!r}: no kernel runs on {device}: "
                          + "; ".join(f"{name}: {self._passed_over[name]}" for name in names)
                          + "; use attention='auto'")
