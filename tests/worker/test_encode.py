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


def _zlib_level_class(png: bytes) -> int:
    """FLEVEL of the first IDAT's zlib header: 0 for zlib level 1, 1 for 2-5, 2 for 6, 3 for 7-9 (RFC 1950)."""
    offset = 8  # the PNG signature; then chunks of length (4), type (4), data, CRC (4)
    while png[offset + 4:offset + 8] != b"IDAT":
        offset += 12 + int.from_bytes(png[offset:offset + 4], "big")
    return png[offset + 9] >> 6  # data begins at offset + 8: CMF, then FLG


def _flevel(level: int) -> int:
    return 0 if level <= 1 else 1 if level <= 5 else 2 if level == 6 else 3


@pytest.mark.parametrize("level", [None, 1, 6, 9])
def test_png_uses_the_zlib_level_asked_for_and_stays_lossless(tmp_path, level):
    frames = _frames(1, 64, 64)
    path = tmp_path / "still.png"
    encode.write_png(frames, path, **({} if level is None else {"compress_level": level}))
    expected = _flevel(encode.PNG_COMPRESS_LEVEL if level is None else level)  # None: the worker's level
    assert _zlib_level_class(path.read_bytes()) == expected
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
    # Only this process's folders: other farm processes on the machine may be encoding meanwhile.
    ours = f"{encode._scratch_prefix()}{os.getpid()}-*"
    before = set(Path(tempfile.gettempdir()).glob(ours))
    encode.write_mp4(_frames(3, 16, 16), 8.0, tmp_path / "clip.mp4")
    assert set(Path(tempfile.gettempdir()).glob(ours)) == before


# -- sound --------------------------------------------------------------------------------------------
# Read back with ffmpeg's demuxer and decoder (not our encode path) and with Python's own wave module.

RATE = 8000


def _tone(hz: float, seconds: float, rate: int = RATE, channels: int = 2) -> encode.Soundtrack:
    t = np.arange(int(seconds * rate)) / rate
    wave_ = 0.5 * np.sin(2 * np.pi * hz * t).astype(np.float32)
    return encode.Soundtrack(np.stack([wave_] * channels), rate)


def _audio_streams(path: Path) -> list[str]:
    """The `Audio:` stream lines ffmpeg prints for ``path``."""
    info = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path)],
                          capture_output=True, text=True).stderr
    return [line.strip() for line in info.splitlines() if "Audio:" in line]


def _decoded_audio(path: Path, channels: int) -> np.ndarray:
    """The first audio track, decoded to float32 ``[N, channels]`` at its own rate."""
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-map", "0:a:0",
                          "-f", "f32le", "-acodec", "pcm_f32le", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, dtype="<f4").reshape(-1, channels)


def _peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("rate", [8000, 48000])
def test_mp4_with_sound_has_an_aac_track_at_the_decoded_rate_and_the_clips_duration(tmp_path, rate):
    frames = _frames(9, 32, 48)
    sound = _tone(440.0, 9 / 24.0, rate)  # exactly the clip's 0.375 s
    path = tmp_path / ".clip.mp4.a1.1.tmp"
    encode.write_mp4(frames, 24.0, path, sound)

    (stream,) = _audio_streams(path)
    assert "aac" in stream and f"{rate} Hz" in stream and "stereo" in stream
    decoded = _decoded_audio(path, 2)
    # AAC codes whole 1024-sample frames; the MP4 edit list trims the encoder delay and padding back off.
    assert len(decoded) == sound.waveform.shape[1]
    assert _peak_hz(decoded[:, 0], rate) == pytest.approx(440.0, abs=rate / len(decoded))
    reader = imageio_ffmpeg.read_frames(str(path))  # the picture is unchanged by the extra track
    meta = next(reader)
    assert (meta["codec"], meta["fps"]) == ("h264", 24.0) and sum(1 for _ in reader) == 9


def test_mp4_without_sound_has_no_audio_track(tmp_path):
    path = tmp_path / "silent.mp4"
    encode.write_mp4(_frames(5, 16, 16), 24.0, path)
    assert _audio_streams(path) == []


def test_wav_is_16_bit_pcm_at_the_decoded_rate(tmp_path):
    import wave

    sound = _tone(660.0, 0.5)
    sound.waveform[1] *= -1  # the channels differ, so their order is checked
    path = tmp_path / ".clip.wav.a1.1.tmp"
    encode.write_wav(sound, path)
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (2, 2, RATE)
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)
    assert pcm.shape == (4000, 2)
    np.testing.assert_allclose(pcm.T / 32768.0, sound.waveform, atol=2 / 32768)


@pytest.mark.parametrize(
    "waveform,rate,message",
    [
        pytest.param(np.zeros(100, np.float32), RATE, r"float waveform \[channels, N\]", id="no-channel-axis"),
        pytest.param(np.zeros((2, 100), np.int16), RATE, r"float waveform \[channels, N\]", id="integers"),
        pytest.param(np.full((2, 100), np.nan, np.float32), RATE, "NaN or infinite", id="nan"),
        pytest.param(np.zeros((2, 100), np.float32), 0, "positive whole number of Hz", id="rate"),
    ],
)
def test_bad_sound_is_refused(waveform, rate, message):
    with pytest.raises(ValueError, match=message):
        encode.Soundtrack(waveform, rate)


def test_a_rate_aac_cannot_carry_is_refused_rather_than_resampled(tmp_path):
    with pytest.raises(ValueError, match=r"400 Hz cannot be an AAC track without resampling"):
        encode.write_mp4(_frames(5, 16, 16), 24.0, tmp_path / "x.mp4", _tone(100.0, 0.2, rate=400))
    assert not (tmp_path / "x.mp4").exists()


# -- a clip encoded while it is decoded ----------------------------------------------------------------

def _whole_clip_mp4(frames: np.ndarray, fps: float, sound: encode.Soundtrack | None, folder: Path) -> bytes:
    """The MP4 of ffmpeg fed the whole clip in one write, with the writer's own arguments (the reference)."""
    _, height, width, _ = frames.shape
    audio = None
    if sound is not None:
        audio = folder / "sound.wav"
        encode._encode_wav(sound, audio, codec="pcm_f32le")
    path = folder / "whole.mp4"
    arguments = encode._h264_arguments(width, height, fps, audio, encode.MP4_PRESET)
    subprocess.run(encode._ffmpeg_command(arguments, path), input=frames.tobytes(), check=True, capture_output=True)
    return path.read_bytes()


@pytest.mark.parametrize("with_sound", [False, True], ids=["silent", "sound"])
def test_a_clip_fed_in_decode_chunks_is_byte_for_byte_the_clip_fed_whole(tmp_path, with_sound):
    frames = np.random.default_rng(0).integers(0, 256, size=(13, 32, 48, 3), dtype=np.uint8)
    sound = _tone(440.0, 13 / 24.0) if with_sound else None
    with encode.Mp4Stream() as stream:
        stream.start(frames.shape, 24.0, *((sound.waveform, sound.sampling_rate) if sound else (None, None)))
        for chunk in (frames[:1], frames[1:5], frames[5:9], frames[9:]):  # the VAE's: one frame, then 4 each
            stream.write(chunk)
        stream.finish(tmp_path / "chunked.mp4")
    whole = _whole_clip_mp4(frames, 24.0, sound, tmp_path)
    assert (tmp_path / "chunked.mp4").read_bytes() == whole
    streamed = tmp_path / "write_mp4.mp4"
    encode.write_mp4(frames, 24.0, streamed, sound)
    assert streamed.read_bytes() == whole


def _ours() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob(f"{encode._scratch_prefix()}{os.getpid()}-*"))


def test_a_stream_closed_before_its_end_stops_ffmpeg_and_leaves_no_scratch(tmp_path):
    before = _ours()
    stream = encode.Mp4Stream()
    stream.start((9, 16, 16, 3), 24.0)
    stream.write(_frames(1, 16, 16))  # then the decode fails
    process = stream._process
    stream.close()
    assert process.poll() is not None and _ours() == before
    assert list(tmp_path.iterdir()) == []


def test_frames_of_another_size_than_started_are_refused_by_the_read_back(tmp_path):
    with encode.Mp4Stream() as stream:
        stream.start((9, 16, 16, 3), 24.0)
        stream.write(_frames(5, 16, 16))
        with pytest.raises(encode.EncodeError, match="reads back as 5 frames of 16x16; 9 frames of 16x16 were"):
            stream.finish(tmp_path / "short.mp4")
