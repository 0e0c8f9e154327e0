"""The Wan 2.2 VAE decode of a clip: diffusers' ``AutoencoderKLWan`` against fastvae's fused, temporally chunked
decoder (https://github.com/Occipital-Labs/fastvae, MIT), side by side in one process on one GPU.

The latents look like real ones: a synthetic 1280x720 video of moving shapes over gradients and texture is encoded
by the same VAE (Wan 2.2's config, z_dim 48, random weights: no published weights can be fetched here), and every
arm decodes those latents. Per arm: seconds per decode (the first one apart: cuDNN's set-up, Triton's compile),
the peak allocated GiB above the VAE's weights, and the frames' PSNR against diffusers' decode as the pipeline
turns them into ``uint8`` (``cosmos3.media.to_uint8_frames``). A tiny decode first measures what a worker's
warm-up can pay before its first clip.

    python -m benchmarks.bench_vae_decode --out $OUT/vae-decode.json [--frames 189] [--chunks 2 4]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import GIB, machine
from cosmos3.media import to_uint8_frames
from testbed.wan_vae import WAN22_VAE, synthetic_video
from toy import measure


def timed(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - start, (torch.cuda.max_memory_allocated() - base) / GIB


def arm(name: str, decode, z: torch.Tensor, reference: np.ndarray | None, repeats: int) -> tuple[dict, np.ndarray]:
    runs = []
    for _ in range(1 + repeats):
        video, seconds, peak = timed(lambda: decode(z))
        runs.append((seconds, peak))
        frames = to_uint8_frames(video[0])  # [T, H, W, 3]
        del video
        torch.cuda.empty_cache()
    result = {"arm": name, "first_s": runs[0][0], "seconds": [s for s, _ in runs[1:]],
              "peak_gib": max(p for _, p in runs), "frames": list(frames.shape)}
    if reference is not None:
        result["psnr_db"] = measure.psnr(frames, reference)
        result["max_abs_levels"] = int(np.abs(frames.astype(np.int16) - reference.astype(np.int16)).max())
    print(json.dumps(result), flush=True)
    return result, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=189)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--chunks", type=int, nargs="*", default=[2, 4], help="fastvae's latent frames per chunk")
    parser.add_argument("--repeats", type=int, default=2, help="timed decodes after the first, per arm")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from diffusers import AutoencoderKLWan

    device = torch.device("cuda")
    torch.manual_seed(0)
    with device:
        vae = AutoencoderKLWan(**WAN22_VAE).to(torch.bfloat16).eval()
    results: dict = {"machine": machine(), "shape": [args.frames, args.height, args.width], "arms": []}
    with torch.no_grad():
        video = synthetic_video(args.frames, args.height, args.width, device).to(torch.bfloat16)
        start = time.perf_counter()
        z = vae.encode(video).latent_dist.mode()  # [1, 48, T', H/16, W/16]
        torch.cuda.synchronize()
        results["encode_s"] = time.perf_counter() - start
        del video
        torch.cuda.empty_cache()
        results["latents"] = {"shape": list(z.shape), "std": float(z.float().std()), "mean": float(z.float().mean())}
        print(json.dumps(results), flush=True)

        vae.disable_tiling()
        base, reference = arm("diffusers bf16 untiled", lambda lat: vae.decode(lat).sample, z, None, args.repeats)
        saturated = float(((reference == 0) | (reference == 255)).mean())
        base["saturated_fraction"] = saturated  # frames at the clamp say little about a decode's agreement
        results["arms"].append(base)

        from fastvae import FastVAEDecoder

        fast = FastVAEDecoder.from_vae(vae).to(device)
        tiny = z[:, :, :2, :8, :8].contiguous()
        _, seconds, _ = timed(lambda: fast.decode(tiny))
        results["fastvae_tiny_first_s"] = seconds  # the Triton compile a warm-up pays
        _, seconds, _ = timed(lambda: fast.decode(tiny))
        results["fastvae_tiny_again_s"] = seconds
        for chunk in args.chunks:
            result, _ = arm(f"fastvae chunk {chunk}", lambda lat, c=chunk: fast.decode(lat, chunk_frames=c), z,
                            reference, args.repeats)
            results["arms"].append(result)
    for result in results["arms"]:
        result["median_s"] = float(np.median(result["seconds"]))
        psnr = result.get("psnr_db")
        if psnr is not None and math.isinf(psnr):
            result["psnr_db"] = "inf"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
