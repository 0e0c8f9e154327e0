"""Every attention kernel we can install and run, at the Nano GEN shapes, side by side (needs CUDA).

Shapes: 44,160 GEN queries (720p, 189 frames) and 1,024 (T2I 1024x1024), each against 512 UND keys
plus its own GEN keys; 32 query / 8 KV heads, head_dim 128, bf16 in and out. Inputs are built the
way a GEN layer builds them: hidden states with a shared offset (the common component real hidden
states carry) through random projections, per-head RMSNorm with log-normal weights (median 1.35, so
logits spread as in a trained model instead of staying near zero), then the model's mRoPE on the
clip's token grid (text positions for the UND keys).

Per kernel: median ms (CUDA events), TFLOP/s (4 * Sq * Sk * heads * hd flops), and the relative L2
error against fp32 attention of 256 random query rows over all keys. FP8 rows include smoothing,
computing the scales and quantizing Q/K/V each call (also timed alone); ``fp8 reference`` rows are
our fp32 emulation of the FP8 recipe, with and without smoothing, for the error column only.

    python benchmarks/bench_attention.py [--tokens 1024 44160] [--iters 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import timed  # noqa: E402
from cosmos3 import ops  # noqa: E402
from cosmos3.layers.attention_kernels import (  # noqa: E402
    CudnnFp8Kernel,
    Fa3Kernel,
    FlashInferKernel,
    SdpaKernel,
    exact_attention,
    fp8_attention_reference,
    fp8_inputs,
)
from cosmos3.layers.rope import MRoPE, grid_positions, text_positions  # noqa: E402

GRIDS = {1024: (1, 32, 32), 44160: (48, 23, 40)}  # patch grid (T, Hp, Wp) of each GEN token count
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, TEXT = 32, 8, 128, 4096, 512
ERROR_ROWS = 256


def realistic_qkv(n_gen: int, seed: int = 0):
    """q ``[n_gen, 32, 128]``, k/v ``[512 + n_gen, 8, 128]`` bf16 on CUDA, as a GEN layer produces them."""
    g = torch.Generator("cuda").manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, device="cuda") * std

    offset = randn(HIDDEN, std=2.0)  # shared by every token
    rope = MRoPE(HEAD_DIM, 5e6, (24, 20, 20)).cuda()
    t, hp, wp = GRIDS[n_gen]
    positions = [text_positions(TEXT), grid_positions((t, hp, wp), TEXT + 15000, fps=24.0 if t > 1 else None,
                                                      base_fps=24.0, temporal_compression=4)]
    k = v = torch.empty(0, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)  # what UND keys follow
    for tokens, pos in ((TEXT, positions[0]), (n_gen, positions[1])):  # UND, then GEN after UND's K/V
        x = (randn(tokens, HIDDEN) + offset).bfloat16()
        cos, sin = rope(pos, torch.bfloat16)
        q_new, k_new, v_new = (x @ randn(HIDDEN, heads * HEAD_DIM, std=HIDDEN**-0.5).bfloat16()
                               for heads in (HEADS, KV_HEADS, KV_HEADS))
        q_weight, k_weight = (torch.exp(randn(HEAD_DIM, std=0.5) + 0.3).bfloat16() for _ in range(2))
        q, k, v = ops.attention_inputs(q_new.view(tokens, HEADS, HEAD_DIM), k_new.view(tokens, KV_HEADS, HEAD_DIM),
                                       v_new.view(tokens, KV_HEADS, HEAD_DIM), q_weight, k_weight, 1e-6, cos, sin, k, v)
    return q, k, v


def candidates() -> dict:
    """name -> (kernel(q, k, v) -> [Sq, nh*hd], note); missing libraries are reported, not skipped silently."""
    from torch.nn.attention import SDPBackend

    found, missing = {}, {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        kernel = SdpaKernel(backend, pinned=True)
        found[kernel.name] = (lambda q, k, v, kernel=kernel: kernel(q, k, v, causal=False), "torch")
    cudnn_sdpa = SdpaKernel(SDPBackend.CUDNN_ATTENTION, pinned=True)

    def expanded(q, k, v):  # cuDNN with K/V repeated to 32 heads (what GQA costs it, if anything)
        group = q.shape[1] // k.shape[1]
        return cudnn_sdpa(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal=False)
    found["sdpa-cudnn, K/V expanded"] = (expanded, "torch")
    try:
        import cudnn

        note = f"nvidia-cudnn-frontend, cuDNN {cudnn.backend_version_string()}"
        fp8, fp8_raw_v = CudnnFp8Kernel(), CudnnFp8Kernel(smooth_values=False)
        found["cudnn-fp8 (K and V smoothed: the model's)"] = (lambda q, k, v: fp8(q, k, v, causal=False), note)
        found["cudnn-fp8, V not smoothed"] = (lambda q, k, v: fp8_raw_v(q, k, v, causal=False), note)
    except Exception as err:  # noqa: BLE001 - report why it could not run
        missing["cudnn-fp8"] = f"{type(err).__name__}: {err}"
    for cls, library, how in ((Fa3Kernel, "fa3-fwd", "prebuilt"),
                              (FlashInferKernel, "flashinfer-python", "JIT-compiled on first call")):
        try:
            kernels = (cls(fp8=False), cls(fp8=True))
        except Exception as err:  # noqa: BLE001
            missing[library] = f"{type(err).__name__}: {err}"
            continue
        note = f"{library} {_version(library)} ({how})"
        for kernel in kernels:
            found[kernel.name] = (lambda q, k, v, kernel=kernel: kernel(q, k, v, causal=False), note)
    try:
        from sageattention import sageattn

        def sage(q, k, v):  # INT8 QK (per block, K smoothed in place: hence the clone), fp16 PV
            out = sageattn(q[None], k[None].clone(), v[None], tensor_layout="NHD", is_causal=False)
            return out[0].reshape(q.shape[0], -1)
        found["sageattention 1 (int8 QK, fp16 PV)"] = (sage, "sageattention 1.0.6 (Triton)")
    except Exception as err:  # noqa: BLE001
        missing["sageattention"] = f"{type(err).__name__}: {err}"
    return found, missing


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:  # a copy of the package without its metadata (as carried to a test machine)
        return "(version unknown)"


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def run_shape(n_gen: int, kernels: dict, iters: int) -> list[dict]:
    q, k, v = realistic_qkv(n_gen)
    rows_idx = torch.randperm(n_gen, generator=torch.Generator().manual_seed(1))[:ERROR_ROWS].cuda()
    ref = exact_attention(q[rows_idx], k, v, causal=False)  # [256, nh*hd] fp32
    flops = 4 * q.shape[0] * k.shape[0] * HEADS * HEAD_DIM
    rows = []
    for name, (kernel, note) in kernels.items():
        try:
            start = time.perf_counter()
            out = kernel(q, k, v)
            torch.cuda.synchronize()
            first = time.perf_counter() - start  # plan building or JIT compilation, if any
            ms = timed(lambda: kernel(q, k, v), iters, warmup=3)
            rows.append(dict(name=name, ms=ms, tflops=flops / ms / 1e9, err=rel_l2(out[rows_idx], ref), first=first,
                             note=note))
        except Exception as err:  # noqa: BLE001 - one kernel's failure is a table row, not a crash
            rows.append(dict(name=name, ms=float("nan"), tflops=float("nan"), err=float("nan"), first=float("nan"),
                             note=f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}"))
        torch.cuda.empty_cache()
    quant_ms = timed(lambda: fp8_inputs(q, k, v), iters, warmup=3)  # smoothing K and V included
    rows.append(dict(name="  (FP8 scales + quantize Q/K/V alone)", ms=quant_ms, tflops=float("nan"),
                     err=float("nan"), first=float("nan"), note="part of every FP8 kernel's row"))
    for smooth in (True, False):
        # The emulation holds [32, 256, Sk] scores: it runs on the error rows only, quantized as the kernel does.
        emulated = fp8_attention_reference(q, k, v, causal=False, fp8_output=True, smooth_k=smooth, smooth_v=smooth,
                                           rows=rows_idx)
        rows.append(dict(name=f"fp8 reference (fp32 emulation, {'K and V smoothed' if smooth else 'no smoothing'})",
                         ms=float("nan"), tflops=float("nan"), err=rel_l2(emulated, ref), first=float("nan"),
                         note="error only"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[44160, 1024], choices=sorted(GRIDS))
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, sm_{props.major}{props.minor}, CUDA {torch.version.cuda}, torch {torch.__version__}, "
          f"cuDNN (torch) {torch.backends.cudnn.version()}")
    kernels, missing = candidates()
    for name, why in missing.items():
        print(f"not available: {name}: {why}")
    for n in args.tokens:
        rows = run_shape(n, kernels, args.iters)
        print(f"\n### {n:,} queries x {n + TEXT:,} keys, {HEADS}/{KV_HEADS} heads, d {HEAD_DIM}; error: relative L2 "
              f"vs fp32 over {ERROR_ROWS} query rows")
        print("| kernel | ms | TFLOP/s | rel. L2 error | first call s | library / note |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['name']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['err']:.4f} | {r['first']:.2f} "
                  f"| {r['note']} |")


if __name__ == "__main__":
    main()
