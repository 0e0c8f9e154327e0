"""Frames -> files: one PNG for an image, an H.264 MP4 for a video.

The path is a temp name chosen by `farm.storage.publish`, so formats are given explicitly rather than
guessed from the extension.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import imageio.v3 as iio
import imageio_ffmpeg
import numpy as np

# Visually lossless H.264; yuv420p is what browsers and players decode; faststart puts the index first
# so a partially downloaded file starts playing.
_MP4_PARAMS = ["-f", "mp4", "-crf", "18", "-preset", "medium", "-movflags", "+faststart"]


def _check(frames: np.ndarray) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")


def write_png(frames: np.ndarray, path: Path) -> None:
    """Writes the single frame of an image render."""  # frames: [1, H, W, 3]
    _check(frames)
    if frames.shape[0] != 1:
        raise ValueError(f"an image render has one frame, got {frames.shape[0]}")
    iio.imwrite(path, frames[0], extension=".png")


def write_mp4(frames: np.ndarray, fps: float, path: Path) -> None:
    """Writes an H.264 MP4 through imageio-ffmpeg's bundled ffmpeg."""  # frames: [T, H, W, 3]
    _check(frames)
    # ffmpeg is a child process: if this worker is killed mid-encode, ffmpeg outlives it and would finish
    # its file after the driver has swept the attempt's temp files. So it writes to local scratch space,
    # and only this process copies the result to `path`.
    with tempfile.TemporaryDirectory(prefix=f"{_scratch_prefix()}{os.getpid()}-") as scratch:
        local = Path(scratch) / "video.mp4"
        _encode_h264(frames, fps, local)
        shutil.copyfile(local, path)


def _scratch_prefix() -> str:
    """This host's encode scratch folders are named prefix + PID + "-" + random, so that
    sweep_orphaned_scratch can tell a dead worker's folder from a live one's."""
    return f"farm-encode-{socket.gethostname()}-"


def sweep_orphaned_scratch() -> list[Path]:
    """Removes the encode scratch folders of this host's dead processes and returns them: a worker killed
    mid-encode (a timeout, Ctrl-C) never reaches its cleanup and leaves a partial video behind. Folders of
    live processes and of other hosts (a shared /tmp) are left alone."""
    prefix = _scratch_prefix()
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        pid = folder.name[len(prefix):].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _encode_h264(frames: np.ndarray, fps: float, path: Path) -> None:
    _, height, width, _ = frames.shape
    # Sizes are multiples of 16 (manifest rule), so ffmpeg never rescales to its macro-block size.
    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=fps, codec="libx264", pix_fmt_out="yuv420p",
        quality=None, macro_block_size=16, output_params=_MP4_PARAMS,
    )
    writer.send(None)  # start ffmpeg
    try:
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()


def write_media(frames: np.ndarray, fps: float, path: Path, *, image: bool) -> None:
    if image:
        write_png(frames, path)
    else:
        write_mp4(frames, fps, path)
