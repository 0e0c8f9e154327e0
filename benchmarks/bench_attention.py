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

    python -m benchmarks.bench_attention [--tokens 1024 44160] [--iters 10]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import timed
from cosmos3.layers.attention_kernels import (
    CudnnFp8Kernel,
    Fa3Kernel,
    FlashInferKernel,
    SdpaKernel,
    exact_attention,
    fp8_attention_reference,
    fp8_inputs,
)
from testbed.attention_inputs import ERROR_ROWS, GRIDS, HEAD_DIM, HEADS, KV_HEADS, TEXT, realistic_qkv


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
