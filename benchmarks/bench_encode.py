"""A Nano clip's MP4 encode (189 frames of 1280x720, what the worker's publish does: x264 at CRF 18, then the
read-back check) with x264 presets side by side, on noise-like frames (a random-weights render, x264's worst
case) and on structured moving frames (gradients sliding across the picture). CPU only: the encode runs on the
worker's host, so its core count decides the absolute times; the ratios carry over.

    python benchmarks/bench_encode.py [--frames 189] [--presets veryfast superfast ultrafast]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.encode import MP4_PRESET, write_mp4  # noqa: E402

HEIGHT, WIDTH = 720, 1280


def clips(frames: int) -> dict[str, np.ndarray]:
    """name -> uint8 ``[T, 720, 1280, 3]``."""
    noise = np.random.default_rng(0).integers(0, 256, (frames, HEIGHT, WIDTH, 3), dtype=np.uint8)
    t = np.arange(frames)[:, None, None]
    y, x = np.arange(HEIGHT)[None, :, None], np.arange(WIDTH)[None, None, :]
    channels = [(x + 3 * t) % 256, (y + 2 * t) % 256, ((x + y) // 4 + t) % 256]  # each broadcasts to [T, H, W]
    structured = np.stack(np.broadcast_arrays(*channels), axis=-1).astype(np.uint8)
    return {"noise": noise, "structured": structured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=189)
    parser.add_argument("--presets", nargs="+", default=[MP4_PRESET, "superfast", "ultrafast"])
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.frames} frames of {WIDTH}x{HEIGHT}; the worker's preset: {MP4_PRESET}")
    print("| frames | preset | encode + read-back s | vs the worker's preset | MB | size vs the worker's |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, frames in clips(args.frames).items():
            base = None
            for preset in args.presets:
                path = Path(folder) / f"{name}-{preset}.mp4"
                started = time.perf_counter()
                write_mp4(frames, 24.0, path, preset=preset)
                seconds, size = time.perf_counter() - started, path.stat().st_size
                base = base or (seconds, size)
                print(f"| {name} | {preset} | {seconds:.2f} | {base[0] / seconds:.2f}x | {size / 1e6:.1f} | "
                      f"{size / base[1]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
