"""Frames -> PNG / H.264 MP4, read back through imageio."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import imageio.v3 as iio
import imageio_ffmpeg
import numpy as np
import pytest

from worker import encode

SHAPES = [pytest.param((9, 32, 48), id="9x32x48"), pytest.param((1, 16, 16), id="one-frame")]


def _frames(count: int, height: int, width: int) -> np.ndarray:
    ramp = np.linspace(0, 255, count * height * width * 3) % 256
    return ramp.astype(np.uint8).reshape(count, height, width, 3)


def test_png_round_trips_exactly(tmp_path):
    frames = _frames(1, 32, 48)
    path = tmp_path / ".still.png.a1.1.tmp"  # a temp name: the format must not come from the extension
    encode.write_png(frames, path)
    assert np.array_equal(iio.imread(path, extension=".png"), frames[0])


@pytest.mark.parametrize("shape", SHAPES)
def test_mp4_is_h264_with_every_frame(tmp_path, shape):
    frames = _frames(*shape)
    path = tmp_path / ".clip.mp4.a1.1.tmp"
    encode.write_mp4(frames, 24.0, path)

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    assert (meta["codec"], meta["size"], meta["fps"]) == ("h264", (shape[2], shape[1]), 24.0)
    assert sum(1 for _ in reader) == shape[0]


def test_a_flat_colour_survives_h264_within_a_few_levels(tmp_path):
    frames = np.full((5, 32, 32, 3), (200, 40, 90), dtype=np.uint8)
    path = tmp_path / "flat.mp4"
    encode.write_mp4(frames, 8.0, path)
    decoded = np.stack(list(iio.imiter(path, plugin="FFMPEG")))
    assert np.abs(decoded.astype(int) - frames.astype(int)).max() <= 3  # yuv420p rounding of one colour


@pytest.mark.parametrize("frames", [np.zeros((2, 16, 16, 3), np.float32), np.zeros((16, 16, 3), np.uint8)],
                         ids=["float", "no-time-axis"])
def test_wrong_frames_are_refused(tmp_path, frames):
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
        encode.write_mp4(frames, 24.0, tmp_path / "x.mp4")


def test_an_image_render_has_one_frame(tmp_path):
    with pytest.raises(ValueError, match="one frame"):
        encode.write_png(_frames(2, 16, 16), tmp_path / "x.png")


def _scratch(owner: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"farm-encode-{owner}-"))
    (folder / "video.mp4").write_bytes(b"partial")
    return folder


def test_scratch_of_dead_processes_on_this_host_is_swept_and_nothing_else():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    orphan, live, elsewhere = (_scratch(f"{host}-{dead.stdout.strip()}"), _scratch(f"{host}-{os.getpid()}"),
                               _scratch(f"another-host-{dead.stdout.strip()}"))
    try:
        assert orphan in encode.sweep_orphaned_scratch()
        assert not orphan.exists() and live.exists() and elsewhere.exists()
    finally:
        for folder in (orphan, live, elsewhere):
            shutil.rmtree(folder, ignore_errors=True)


def test_an_mp4_encode_leaves_no_scratch_folder(tmp_path):
    before = set(Path(tempfile.gettempdir()).glob("farm-encode-*"))
    encode.write_mp4(_frames(3, 16, 16), 8.0, tmp_path / "clip.mp4")
    assert set(Path(tempfile.gettempdir()).glob("farm-encode-*")) == before
