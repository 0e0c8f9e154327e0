"""Frames -> files: one PNG for an image, an H.264 MP4 for a video (with an AAC track when it has sound),
and a 16-bit PCM WAV of the sound on request.

A clip's MP4 is an `Mp4Stream`: ffmpeg starts before the first frame is decoded and a thread feeds it each chunk of
frames as the pipeline decodes it, so once the decode ends only its last chunk's encode is left (`write_mp4`
streams a whole clip the same way: one command, so the same bytes however the frames were cut).

Each writer fills `out`: the binary handle of the temp file `farm.storage.publish` created (or a path, opened
here), so formats are given explicitly rather than guessed from a name. Files are encoded and read back in
local scratch space or memory, then copied through the handle, never reopened by name in the output folder.
Sound keeps the sample rate the sound tokenizer decoded at: ffmpeg is told
that rate for input and output, so it never resamples.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import IO

import imageio.v3 as iio
import imageio_ffmpeg
import numpy as np

from farm.errors import StorageFault
from farm.processes import pid_alive

# Visually lossless H.264; yuv420p is what browsers and players decode; faststart puts the index first
# so a partially downloaded file starts playing. Preset veryfast: x264's medium took 5.8 s for a Nano clip
# (189 frames of 720p) on the H200's host while the GPU waited; veryfast encodes 3-5x faster at CRF 18
# with files no larger (benchmarks/results/cpu-encode.md).
# benchmarks/bench_encode.py: superfast is 1.3x faster, ultrafast 3.3x but 1.2x (noise) to 2.7x (structured frames)
# larger; structured frames encode 4x faster than the noise of a random-weights render.
MP4_PRESET = "veryfast"
# zlib level 1: a 1024x1024 still with a photo's grain encodes 3.4x faster than at Pillow's default 6 (0.18 vs
# 0.60 s on 2 cores) for a file 19% larger (bench_encode.py); the still's GPU is not released until it is published.
PNG_COMPRESS_LEVEL = 1
_MP4_PARAMS = ["-f", "mp4", "-crf", "18", "-movflags", "+faststart"]
# The sampling frequencies an AAC stream can signal (ISO 14496-3 table 1.18); others would need resampling.
AAC_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
_AAC_PARAMS = ["-b:a", "192k"]


@dataclass(frozen=True)
class Soundtrack:
    """A render's sound: the float waveform ``[channels, N]`` (nominally in [-1, 1]) and its sample rate."""

    waveform: np.ndarray
    sampling_rate: int  # Hz

    def __post_init__(self):
        w = self.waveform
        if not isinstance(w, np.ndarray) or w.ndim != 2 or w.dtype.kind != "f" or not 1 <= w.shape[0] <= 8:
            shape = getattr(w, "shape", None)
            kind = getattr(w, "dtype", type(w))
            raise ValueError(f"sound must be a float waveform [channels, N], got {kind} {shape}")
        if not np.isfinite(w).all():
            raise ValueError("sound holds NaN or infinite samples")
        if not isinstance(self.sampling_rate, int) or self.sampling_rate <= 0:
            raise ValueError(f"sampling_rate must be a positive whole number of Hz, got {self.sampling_rate!r}")

    @property
    def duration(self) -> float:
        return self.waveform.shape[1] / self.sampling_rate

    def record(self) -> dict:
        """What a sidecar says about it."""
        channels, samples = self.waveform.shape
        return {"sampling_rate": self.sampling_rate, "channels": channels, "samples": samples,
                "duration": self.duration}


class EncodeError(RuntimeError):
    """ffmpeg failed, or the file does not read back as rendered: this attempt failed, not the job."""


def _check(frames: np.ndarray) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")


Target = IO[bytes] | str | os.PathLike  # a binary handle to fill, or a path to write


@contextlib.contextmanager
def _opened(out: Target) -> Iterator[IO[bytes]]:
    """`out` itself when it is a handle (the caller's to close), else the file at that path, opened for writing."""
    if hasattr(out, "write"):
        yield out
    else:
        with open(out, "wb") as handle:
            yield handle


def write_png(frames: np.ndarray, out: Target, *, compress_level: int = PNG_COMPRESS_LEVEL) -> None:
    """Writes the single frame of an image render; ``compress_level`` is zlib's (benchmarks compare them)."""
    _check(frames)  # [1, H, W, 3]
    if frames.shape[0] != 1:
        raise ValueError(f"an image render has one frame, got {frames.shape[0]}")
    data = iio.imwrite("<bytes>", frames[0], extension=".png", compress_level=compress_level)
    try:
        back = iio.imread(data, extension=".png")
    except (OSError, ValueError) as err:
        raise EncodeError(f"the PNG does not read back as a PNG: {err}") from None
    if not np.array_equal(back, frames[0]):
        raise EncodeError(f"the PNG reads back as {list(back.shape)}, not the rendered {list(frames[0].shape)}")
    with _opened(out) as handle:
        _check_space(handle, len(data), "publishing the PNG")
        handle.write(data)


def write_mp4(frames: np.ndarray, fps: float, out: Target, sound: Soundtrack | None = None, *,
              preset: str = MP4_PRESET) -> None:
    """Writes an H.264 MP4 (plus an AAC track of ``sound``) through imageio-ffmpeg's bundled ffmpeg; ``preset``
    is x264's (benchmarks compare them)."""
    _check(frames)  # [T, H, W, 3]
    with Mp4Stream(preset=preset) as stream:
        stream.start(frames.shape, fps, *((sound.waveform, sound.sampling_rate) if sound else (None, None)))
        stream.write(frames)
        stream.finish(out)


class Mp4Stream:
    """An H.264 MP4 (with an AAC track of the sound) encoded from chunks of frames as they come: a
    `cosmos3.pipeline.FrameSink`. `start` writes the sound's WAV and starts ffmpeg; each `write` queues a chunk that a
    thread feeds to ffmpeg's pipe, so the caller never waits for the encoder; `finish` waits for the encode of every
    chunk, checks the file and copies it to `out`; `close` (or leaving a `with`) ends a stream that did not finish,
    ffmpeg included, and removes its scratch. Chunks are kept, not copied, until fed: the caller must not change them.
    """

    def __init__(self, *, preset: str = MP4_PRESET):
        self._preset = preset
        self._chunks: queue.SimpleQueue[np.ndarray | None] = queue.SimpleQueue()  # None: no more chunks
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._process: subprocess.Popen | None = None
        self._feeder: threading.Thread | None = None
        self._shape: tuple[int, int, int, int] | None = None  # [T, H, W, 3] of the whole clip
        self._started_at = 0.0
        self.seconds: float | None = None  # from start until the MP4 was in `out` (finish)

    def __enter__(self) -> Mp4Stream:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    @property
    def started(self) -> bool:
        return self._process is not None

    def start(self, shape: tuple[int, int, int, int], fps: float, sound: np.ndarray | None = None,
              sampling_rate: int | None = None) -> None:
        """``shape``: the clip's ``[T, H, W, 3]``; ``sound``: float ``[channels, N]`` at ``sampling_rate`` Hz."""
        track = None if sound is None else Soundtrack(sound, sampling_rate)
        if track is not None and track.sampling_rate not in AAC_RATES:
            raise ValueError(
                f"sound at {track.sampling_rate} Hz cannot be an AAC track without resampling; "
                f"AAC carries {', '.join(map(str, AAC_RATES))} Hz"
            )
        self._started_at = time.perf_counter()
        self._shape = tuple(shape)
        count, height, width, _ = self._shape
        # ffmpeg is a child process: if this worker is killed mid-encode, ffmpeg outlives it and would finish
        # its file after the driver has swept the attempt's temp files. So it writes to local scratch space,
        # and only this process copies the result to `out`.
        self._scratch = _scratch()
        scratch = Path(self._scratch.name)
        # H.264 at crf 18 stays below the yuv420p frames' size (half of rgb24); the WAV is float32.
        _check_space(scratch, count * height * width * 3 // 2 + (track.waveform.nbytes if track else 0), "encoding")
        audio = None
        if track is not None:  # float WAV, so the AAC encoder sees the decoded samples, not a 16-bit copy
            audio = scratch / "sound.wav"
            _encode_wav(track, audio, codec="pcm_f32le")
        self._local = scratch / "video.mp4"
        self._log = scratch / "ffmpeg.log"  # a file, not a pipe: ffmpeg never blocks on a log nobody reads
        command = _ffmpeg_command(_h264_arguments(width, height, fps, audio, self._preset), self._local)
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
        self._feeder = threading.Thread(target=self._feed, name="mp4-feed", daemon=True)
        self._feeder.start()

    def write(self, frames: np.ndarray) -> None:
        """Queues the next chunk, ``uint8 [T_chunk, H, W, 3]``, for the encoder."""
        _check(frames)
        if not self.started:
            raise RuntimeError("Mp4Stream.write before start")
        self._chunks.put(frames)

    def _feed(self) -> None:
        """The thread: each queued chunk into ffmpeg's pipe, then closes it. A pipe ffmpeg closed (it failed) takes
        no more; `finish` reports ffmpeg's own error."""
        pipe = self._process.stdin
        while (frames := self._chunks.get()) is not None:
            if pipe.closed:
                continue
            try:
                pipe.write(memoryview(np.ascontiguousarray(frames).reshape(-1)))
            except OSError:  # BrokenPipeError: ffmpeg exited
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(OSError):
            pipe.close()

    def finish(self, out: Target) -> None:
        """Waits for ffmpeg to encode every chunk written, checks the file holds the whole clip, copies it to `out`.

        # Raises: EncodeError (ffmpeg failed, or the file is not the clip), StorageFault (no space).
        """
        if not self.started:
            raise RuntimeError("Mp4Stream.finish before start")
        self._chunks.put(None)
        self._feeder.join()
        returncode = self._process.wait()
        if returncode != 0:
            raise _ffmpeg_failure(returncode, self._log.read_bytes(), self._local)
        _read_back_mp4(self._local, self._shape)
        _copy(self._local, out, "publishing the MP4")
        self.seconds = time.perf_counter() - self._started_at

    def close(self) -> None:
        """Stops ffmpeg if it still runs and removes the scratch (the MP4 was copied out, or is not wanted)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._feeder is not None:
            self._chunks.put(None)
            self._feeder.join()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def write_wav(sound: Soundtrack, out: Target) -> None:
    """Writes ``sound`` as a 16-bit PCM WAV at its own sample rate (samples beyond [-1, 1] clip)."""
    with _scratch() as scratch:
        local = Path(scratch) / "sound.wav"
        _encode_wav(sound, local, codec="pcm_s16le")
        _copy(local, out, "publishing the WAV")


def _copy(local: Path, out: Target, doing: str) -> None:
    with _opened(out) as handle, open(local, "rb") as source:
        _check_space(handle, local.stat().st_size, doing)
        shutil.copyfileobj(source, handle)


def _scratch() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=f"{_scratch_prefix()}{os.getpid()}-")


def _check_space(where: Path | IO[bytes], needed: int, doing: str) -> None:
    """Refuses to start writing `needed` bytes into a file system with less free: a folder, or the one holding
    an open handle (read through its descriptor)."""
    usage = os.statvfs(where if isinstance(where, Path) else where.fileno())
    free = usage.f_bavail * usage.f_frsize
    if free < needed:
        place = where if isinstance(where, Path) else Path(where.name).parent
        raise StorageFault(f"ENOSPC: {doing} needs about {_size(needed)} in {place}, which has {_size(free)} free")


def _size(count: int) -> str:
    """Bytes as people read them: `812 bytes`, `12.3 KiB`, `4.0 MiB`, `1.5 GiB` (never a rounded-away 0.0)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count} bytes"


def _ffmpeg_command(arguments: list[str], path: Path) -> list[str]:
    return [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-v", "error", *arguments, str(path)]


def _ffmpeg(arguments: list[str], stdin: np.ndarray, path: Path) -> None:
    """Runs the bundled ffmpeg with `stdin` as its input and checks its exit status (imageio-ffmpeg's writer
    does not: on a full disk ffmpeg logs "Error writing trailer" and leaves a truncated file)."""
    raw = np.ascontiguousarray(stdin).reshape(-1).view(np.uint8)  # flat bytes: the pipe is written in slices
    done = subprocess.run(_ffmpeg_command(arguments, path), input=memoryview(raw), capture_output=True)
    if done.returncode != 0:
        raise _ffmpeg_failure(done.returncode, done.stderr, path)


def _ffmpeg_failure(returncode: int, stderr: bytes, path: Path) -> Exception:
    """The error of an ffmpeg that exited with `returncode`: a StorageFault for a full disk, else an EncodeError
    quoting its last line."""
    text = stderr.decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = lines[-1] if lines else "no message"
    if "No space left on device" in text:
        return StorageFault(f"ENOSPC: ffmpeg ran out of space writing {path} ({said})")
    return EncodeError(f"ffmpeg exited with status {returncode} writing {path.name}: {said}")


def _read_back_mp4(path: Path, shape: tuple[int, int, int, int]) -> None:
    """The published file must hold as many frames of the rendered size as were rendered. The first frame is
    decoded (its size); the rest are counted as the container stores them, not decoded: decoding every frame of
    a noise-like Nano clip took 1.16 s against 0.55 s counting on the H200's 16-core host
    (benchmarks/results/cpu-encode.md), and a file cut short counts short either way."""
    count, height, width, _ = shape  # [T, H, W, 3]
    try:
        reader = imageio_ffmpeg.read_frames(str(path))
        size = next(reader)["size"]
        reader.close()
        stored = _stored_video_frames(path)
    except (OSError, RuntimeError, StopIteration) as err:
        lines = [line for line in str(err).splitlines() if line.strip()]
        raise EncodeError(f"{path.name} does not read back as a video: {lines[0] if lines else err!r}") from None
    if (stored, size) != (count, (width, height)):
        raise EncodeError(f"{path.name} reads back as {stored} frames of {size[0]}x{size[1]}; "
                          f"{count} frames of {width}x{height} were rendered")


def _stored_video_frames(path: Path) -> int:
    """The frames of the first video stream, as ffmpeg counts them copying the stream to nowhere."""
    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-v", "error", "-i", str(path), "-map", "0:v:0",
               "-c", "copy", "-f", "null", "-progress", "pipe:1", "-nostats", "-"]
    done = subprocess.run(command, capture_output=True, text=True)
    counts = [line.partition("=")[2] for line in done.stdout.splitlines() if line.startswith("frame=")]
    if done.returncode != 0 or not counts:
        raise RuntimeError(done.stderr.strip() or f"ffmpeg counted no frames (exit status {done.returncode})")
    return int(counts[-1])


def _encode_wav(sound: Soundtrack, path: Path, *, codec: str) -> None:
    channels = sound.waveform.shape[0]
    samples = np.ascontiguousarray(sound.waveform.T, dtype="<f4")  # [N, channels]: ffmpeg reads interleaved
    rate = str(sound.sampling_rate)
    _ffmpeg(["-f", "f32le", "-ar", rate, "-ac", str(channels), "-i", "-", "-c:a", codec, "-ar", rate, "-f", "wav"],
            samples, path)


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
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _h264_arguments(width: int, height: int, fps: float, audio: Path | None, preset: str) -> list[str]:
    """ffmpeg's arguments for rgb24 frames of `width` x `height` on its stdin (and `audio`'s WAV) -> an MP4."""
    # Sizes are multiples of 16 (manifest rule), so ffmpeg needs no rescale to its macro-block size. The fps
    # goes as a fraction, so 24000/1001 is not rounded. The WAV's rate is the AAC track's: ffmpeg keeps an
    # input's rate when no -ar asks otherwise.
    rate = str(Fraction(fps).limit_denominator())
    arguments = ["-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", rate, "-i", "-"]
    if audio is None:
        arguments += ["-an"]
    else:
        arguments += ["-i", str(audio), "-map", "0:v:0", "-map", "1:a:0", "-c:a", "aac", *_AAC_PARAMS]
    return [*arguments, "-c:v", "libx264", "-pix_fmt", "yuv420p", "-preset", preset, *_MP4_PARAMS]


def write_media(frames: np.ndarray, fps: float, out: Target, *, image: bool, sound: Soundtrack | None = None,
                stream: Mp4Stream | None = None) -> None:
    """A PNG for an image, else the clip's MP4: ``stream``'s, fed while the clip was decoded, or, where none was
    started (a renderer that does not stream), encoded here from ``frames``."""
    if image:
        write_png(frames, out)
    elif stream is not None and stream.started:
        stream.finish(out)
    else:
        write_mp4(frames, fps, out, sound)
