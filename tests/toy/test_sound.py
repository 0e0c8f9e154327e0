"""The toy checkpoint's clips sound their shape's colour, read back from the demo's MP4s.

Every clip job of ``manifests/demo.yaml`` renders with the FP8 checkpoint and is encoded the way a worker
publishes it (``worker.encode.write_media``); its sound is then read back from the MP4's AAC track with
ffmpeg's decoder, and its pitch (``toy.measure.pitch``, an FFT peak, knowing nothing of the model) must
name the prompt's colour in at least 80% of the clips. The FP8 waveform must stay within 20 dB SNR of
the BF16 checkpoint's for the same job and seed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import torch

from cosmos3.pipeline import Cosmos3Pipeline
from farm import manifest
from toy import measure, scenes
from worker import encode

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "checkpoints" / "toy"
ACCURACY = 0.8
SNR_BOUND = 20.0  # dB, FP8 against BF16


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread, as tests/toy/test_renders.py renders: shared CI cores make OpenMP threads spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """The demo's clip jobs with their shape colour, parsed back from the prompt by the scene vocabulary.

    The manifest is read from a copy beside a temporary output root (the demo's ../renders need not exist).
    """
    folder = tmp_path_factory.mktemp("demo")
    text = (REPO / "manifests" / "demo.yaml").read_text()
    text = text.replace("../checkpoints/toy/fp8", str(ROOT / "fp8")).replace("../renders/demo", str(folder / "out"))
    (folder / "demo.yaml").write_text(text)
    demo = manifest.load(folder / "demo.yaml")
    jobs = [job for job in demo.jobs if job.request.task == "t2v"]
    assert len(jobs) >= 5
    return [(job, next(word for word in job.request.prompt.split() if word in scenes.PITCHES)) for job in jobs]


@pytest.fixture(scope="module")
def sounds(clips, tmp_path_factory):
    """Per variant and job: the waveform decoded back from the published MP4 (float32 [N, channels])."""
    folder = tmp_path_factory.mktemp("mp4")
    out = {}
    for variant in ("fp8", "bf16"):
        pipe = Cosmos3Pipeline.from_pretrained(ROOT / variant, cache="off")  # the precisions' difference alone
        for job, _ in clips:
            render = pipe(job.request)
            assert render.sound is not None, f"{variant} {job.key}: a toy clip renders its sound"
            path = folder / f"{variant}-{job.key}.mp4"
            encode.write_media(render.frames, render.fps, path, image=False,
                               sound=encode.Soundtrack(render.sound, render.sampling_rate))
            out[variant, job.key] = (_decode_audio(path, render.sound.shape[0]), render.sampling_rate)
    return out


def _decode_audio(path: Path, channels: int) -> np.ndarray:
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-map", "0:a:0",
                          "-f", "f32le", "-acodec", "pcm_f32le", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, dtype="<f4").reshape(-1, channels)


def test_the_pitch_of_the_demo_clips_names_their_colour(clips, sounds):
    heard = {}
    for job, colour in clips:
        samples, rate = sounds["fp8", job.key]
        pitch = measure.pitch(samples.T, rate)
        heard[job.key] = (colour, measure.colour_of_pitch(pitch), pitch)
    report = "\n".join(f"  {key}: {want} -> heard {got} ({hz:.0f} Hz)" for key, (want, got, hz) in heard.items())
    accuracy = np.mean([want == got for want, got, _ in heard.values()])
    print(f"\n{accuracy:.0%} of demo clips sound their colour\n{report}")
    assert accuracy >= ACCURACY, report


def test_fp8_sound_stays_within_20_db_of_bf16(clips, sounds):
    snr = [measure.snr(sounds["bf16", job.key][0], sounds["fp8", job.key][0]) for job, _ in clips]
    print(f"\nFP8 vs BF16 audio SNR (dB): min {min(snr):.1f}, median {np.median(snr):.1f}")
    assert min(snr) >= SNR_BOUND, snr
