"""A Nano clip's MP4 encode (189 frames of 1280x720, what the worker's publish does: x264 at CRF 18, then the
read-back check) with x264 presets side by side, on noise-like frames (a random-weights render, x264's worst
case) and on structured moving frames (gradients sliding across the picture), and the read-back check alone
beside decoding every frame; then the clip streamed as the worker streams it beside its VAE decode (chunks of 1, then
4 frames, released evenly over --decode-seconds, the decode's time), timed from the last chunk's release until the
MP4 is written: what is left of the encode once the decode ends; then a 1024x1024 still's PNG at
zlib levels side by side (noise, the structured frame, and smooth shapes with a photo's grain). CPU only: the
encode runs on the worker's host, so its core count decides the absolute times; the ratios carry over.

    python -m benchmarks.bench_encode [--frames 189] [--presets veryfast superfast ultrafast] [--png-levels 1 3 6]
        [--decode-seconds 5.42]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from worker.encode import MP4_PRESET, PNG_COMPRESS_LEVEL, Mp4Stream, _read_back_mp4, write_mp4, write_png

HEIGHT, WIDTH = 720, 1280


def clips(frames: int, height: int = HEIGHT, width: int = WIDTH) -> dict[str, np.ndarray]:
    """name -> uint8 ``[T, H, W, 3]``."""
    noise = np.random.default_rng(0).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    t = np.arange(frames)[:, None, None]
    y, x = np.arange(height)[None, :, None], np.arange(width)[None, None, :]
    channels = [(x + 3 * t) % 256, (y + 2 * t) % 256, ((x + y) // 4 + t) % 256]  # each broadcasts to [T, H, W]
    structured = np.stack(np.broadcast_arrays(*channels), axis=-1).astype(np.uint8)
    return {"noise": noise, "structured": structured}


def stills() -> dict[str, np.ndarray]:
    """name -> uint8 ``[1, 1024, 1024, 3]``: the clips' kinds, and smooth shapes with a photo's grain."""
    y, x = np.mgrid[0:1024, 0:1024].astype(np.float32)
    shapes = 128 + 50 * np.sin(x / 97) * np.cos(y / 131) + 30 * np.sin((x + 2 * y) / 53)  # [H, W]
    grain = np.random.default_rng(1).normal(0.0, 2.0, (1024, 1024, 3))  # sensor noise, 2 levels RMS
    photo = np.stack([shapes, np.roll(shapes, 40, 0), np.roll(shapes, 80, 1)], axis=-1) + grain  # [H, W, 3]
    return {**clips(1, 1024, 1024), "smooth + grain": np.clip(photo, 0, 255).astype(np.uint8)[None]}


def streamed_tail(frames: np.ndarray, decode_seconds: float, folder: str) -> float:
    """Seconds from the last chunk's release until the MP4 is written, the chunks released as the decode makes them:
    frame 0 alone, then 4 frames a latent frame, evenly over ``decode_seconds``."""
    bounds = [0, *range(1, len(frames), 4), len(frames)]
    chunks = [frames[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    with Mp4Stream() as stream:
        stream.start(frames.shape, 24.0)
        for chunk in chunks:
            time.sleep(decode_seconds / len(chunks))  # the chunk's decode
            stream.write(chunk)
        last = time.perf_counter()
        stream.finish(Path(folder) / "streamed.mp4")
    return time.perf_counter() - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=189)
    parser.add_argument("--presets", nargs="+", default=[MP4_PRESET, "superfast", "ultrafast"])
    parser.add_argument("--png-levels", nargs="+", type=int, default=[PNG_COMPRESS_LEVEL, 3, 6],
                        help="zlib levels; 6 is Pillow's default")
    parser.add_argument("--decode-seconds", type=float, default=5.42,
                        help="the VAE decode the stream runs beside (fastvae's, 720p/189 frames on the H100)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.frames} frames of {WIDTH}x{HEIGHT}; the worker's preset: {MP4_PRESET}")
    print("| frames | preset | encode + read-back s | vs the worker's preset | MB | size vs the worker's |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        checks = []
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
            checks.append((name, frames, Path(folder) / f"{name}-{args.presets[0]}.mp4"))
        print(f"\nThe read-back check of the {args.presets[0]} MP4s: the worker's (first frame decoded, the frames "
              "counted as stored) vs decoding every frame")
        print("| frames | worker's check s | decoding every frame s | ratio |")
        print("|---|---|---|---|")
        for name, frames, path in checks:
            started = time.perf_counter()
            _read_back_mp4(path, frames.shape)
            counted = time.perf_counter() - started
            started = time.perf_counter()
            assert imageio_ffmpeg.count_frames_and_secs(str(path))[0] == len(frames)
            decoded = time.perf_counter() - started
            print(f"| {name} | {counted:.2f} | {decoded:.2f} | {decoded / counted:.1f}x |", flush=True)
        print(f"\nStreamed beside a {args.decode_seconds} s decode ({MP4_PRESET}): the encode left after it")
        print("| frames | whole encode + read-back s | left after the decode s |")
        print("|---|---|---|")
        for name, frames in clips(args.frames).items():
            started = time.perf_counter()
            write_mp4(frames, 24.0, Path(folder) / "whole.mp4")
            whole = time.perf_counter() - started
            print(f"| {name} | {whole:.2f} | {streamed_tail(frames, args.decode_seconds, folder):.2f} |", flush=True)
        print(f"\n1024x1024 stills, the worker's PNG level: {PNG_COMPRESS_LEVEL} (median of 5)")
        print("| still | zlib level | encode + read-back s | vs the worker's level | MB | size vs the worker's |")
        print("|---|---|---|---|---|---|")
        for name, frames in stills().items():
            base = None
            for level in args.png_levels:
                path = Path(folder) / f"still-{level}.png"
                times = []
                for _ in range(5):
                    started = time.perf_counter()
                    write_png(frames, path, compress_level=level)
                    times.append(time.perf_counter() - started)
                seconds, size = sorted(times)[2], path.stat().st_size
                base = base or (seconds, size)
                print(f"| {name} | {level} | {seconds:.3f} | {base[0] / seconds:.2f}x | {size / 1e6:.2f} | "
                      f"{size / base[1]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
