"""An encode that fails, or whose file does not read back as rendered, never publishes.

Failures are injected: an ffmpeg that exits non-zero (as on a full disk: "Error writing trailer"), an encode
whose file is truncated or short of frames, a scratch folder without space, a PNG writer that writes garbage.
"""

from __future__ import annotations

import errno
import os
import shutil
import types
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from farm import storage
from farm.errors import OutputPathError, StorageFault
from worker import encode

FRAMES = np.linspace(0, 255, 9 * 32 * 48 * 3).astype(np.uint8).reshape(9, 32, 48, 3)


def _ffmpeg_script(tmp_path: Path, monkeypatch, body: str) -> None:
    script = tmp_path / "ffmpeg"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(script))


def _publish_mp4(tmp_path: Path, frames: np.ndarray = FRAMES) -> Path:
    final = tmp_path / "out" / "clip.mp4"
    storage.publish(final, lambda temp: encode.write_mp4(frames, 24.0, temp), root=tmp_path / "out")
    return final


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def root(tmp_path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def test_ffmpeg_out_of_space_fails_naming_enospc_and_publishes_nothing(tmp_path, root, monkeypatch):
    _ffmpeg_script(tmp_path, monkeypatch, "cat >/dev/null\n"
                   "echo '[out#0/mp4] Error writing trailer: No space left on device' >&2\nexit 228")
    with pytest.raises(StorageFault, match=r"^ENOSPC: ffmpeg ran out of space .*Error writing trailer"):
        _publish_mp4(tmp_path)
    assert _left(root) == []


def test_ffmpeg_exiting_non_zero_fails_the_encode(tmp_path, root, monkeypatch):
    _ffmpeg_script(tmp_path, monkeypatch, "cat >/dev/null\necho 'Conversion failed!' >&2\nexit 1")
    with pytest.raises(encode.EncodeError, match="ffmpeg exited with status 1 writing .*: Conversion failed!"):
        _publish_mp4(tmp_path)
    assert _left(root) == []


def test_a_truncated_mp4_that_ffmpeg_called_a_success_is_not_published(tmp_path, root, monkeypatch):
    real = encode._read_back_mp4

    def truncated(path, shape):
        os.truncate(path, path.stat().st_size // 2)  # what "Error writing trailer" leaves
        real(path, shape)

    monkeypatch.setattr(encode, "_read_back_mp4", truncated)
    with pytest.raises(encode.EncodeError, match="does not read back as a video"):
        _publish_mp4(tmp_path)
    assert _left(root) == []


def test_an_mp4_short_of_frames_is_not_published(tmp_path, root, monkeypatch):
    real = encode.Mp4Stream.write
    monkeypatch.setattr(encode.Mp4Stream, "write", lambda stream, frames: real(stream, frames[:-1]))
    with pytest.raises(encode.EncodeError, match="reads back as 8 frames of 48x32; 9 frames of 48x32 were rendered"):
        _publish_mp4(tmp_path)
    assert _left(root) == []


def test_scratch_space_is_checked_before_ffmpeg_starts(tmp_path, root, monkeypatch):
    _ffmpeg_script(tmp_path, monkeypatch, f"touch {tmp_path}/ffmpeg-ran")
    monkeypatch.setattr(encode.os, "statvfs", lambda where: types.SimpleNamespace(f_bavail=3, f_frsize=4096))
    with pytest.raises(StorageFault, match=r"^ENOSPC: encoding needs about 3\.4 MiB in .*, which has 12\.0 KiB free"):
        _publish_mp4(tmp_path, np.zeros((9, 512, 512, 3), np.uint8))
    assert not (tmp_path / "ffmpeg-ran").exists() and _left(root) == []


def test_a_png_that_does_not_read_back_is_not_published(tmp_path, root, monkeypatch):
    monkeypatch.setattr(encode.iio, "imwrite", lambda target, frame, **_: b"\x89PNG junk")
    with pytest.raises(encode.EncodeError, match="does not read back as a PNG"):
        storage.publish(root / "still.png", lambda temp: encode.write_png(FRAMES[:1], temp), root=root)
    assert _left(root) == []


def test_a_good_encode_still_publishes(tmp_path, root):
    final = _publish_mp4(tmp_path)
    assert imageio_ffmpeg.count_frames_and_secs(str(final))[0] == 9 and _left(root) == ["clip.mp4"]


# -- storage faults at publish -----------------------------------------------------------------------


def test_an_out_of_space_write_is_a_storage_fault_naming_enospc(root):
    def full(out) -> None:
        out.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), out.name)

    with pytest.raises(StorageFault, match=r"^ENOSPC \(No space left on device\) writing .*clip\.mp4$"):
        storage.publish(root / "city" / "clip.mp4", full, root=root)
    assert _left(root) == []


def test_publish_never_recreates_a_deleted_root(root):
    shutil.rmtree(root)
    with pytest.raises(StorageFault, match=r"output root .* is gone"):
        storage.publish(root / "city" / "clip.mp4", lambda out: out.write(b"x"), root=root)
    assert not root.exists()


def test_publish_refuses_a_folder_that_is_a_symlink_out_of_the_root(tmp_path, root):
    (tmp_path / "elsewhere").mkdir()
    (root / "city").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputPathError, match=r"through the symlink .*city -> .*elsewhere, outside output.root"):
        storage.publish(root / "city" / "clip.mp4", lambda out: out.write(b"x"), root=root)
    assert _left(tmp_path / "elsewhere") == []


def test_a_nearly_full_disk_is_reported_in_numbers_that_are_not_rounded_to_zero(tmp_path, root, monkeypatch):
    monkeypatch.setattr(encode.os, "statvfs", lambda where: types.SimpleNamespace(f_bavail=0, f_frsize=4096))
    with pytest.raises(StorageFault, match=r"^ENOSPC: publishing the PNG needs about \d+ bytes in .*out, "
                                           r"which has 0 bytes free$"):
        storage.publish(root / "still.png", lambda out: encode.write_png(FRAMES[:1], out), root=root)
    assert _left(root) == []


def test_ffmpeg_dying_mid_stream_fails_the_finish_and_publishes_nothing(tmp_path, root, monkeypatch):
    _ffmpeg_script(tmp_path, monkeypatch, "head -c 100 >/dev/null\necho 'Broken at frame 0' >&2\nexit 1")

    def streamed(out):
        with encode.Mp4Stream() as stream:
            stream.start(FRAMES.shape, 24.0)
            for frame in FRAMES:  # chunks keep coming after ffmpeg has gone
                stream.write(frame[None])
            stream.finish(out)

    with pytest.raises(encode.EncodeError, match="ffmpeg exited with status 1 writing .*: Broken at frame 0"):
        storage.publish(root / "clip.mp4", streamed, root=root)
    assert _left(root) == []
