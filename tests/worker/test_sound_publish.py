"""A clip's sound through the worker: muxed into the MP4, the WAV beside it on request, both in the sidecar.

Read back independently of our encoder: ffmpeg's demuxer names the audio stream and its rate, its decoder
gives the samples, Python's wave module reads the WAV. A render with the real pipeline on a tiny random
sound checkpoint, and the fake's hum for the plumbing; a job the model cannot give sound publishes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import wave
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import ray

from cosmos3.rules.request import RenderRequest
from farm import manifest, storage
from tests.farm.helpers import local_cluster, render_and_publish, write_manifest
from tests.tiny_checkpoint import make_tiny_checkpoint
from worker import fake
from worker.actor import RenderWorker, cosmos3_factory

ORIGIN = {"run": "run-1", "path": "/m.yaml", "sha256": "abc", "name": "test"}
RATE = 8000  # both test checkpoints' sound tokenizer: 8 kHz, stereo
CLIP = {"size": [48, 32], "frames": 9, "fps": 24, "steps": 2}  # 0.375 s = 3000 samples


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(num_gpus=1, num_cpus=2):
        yield


def _render(m: manifest.Manifest, factory, job, attempt: int = 1):
    origin = {**ORIGIN, "root": m.output_root}
    Path(m.output_root).mkdir(exist_ok=True)  # the driver makes it at submit start; publishing never does
    worker = ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0).remote(m.model, factory, origin, 0)
    try:
        return render_and_publish(worker, job, attempt)
    finally:
        ray.kill(worker)


def _audio_stream(path: str) -> str:
    info = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", path], capture_output=True,
                          text=True).stderr
    (stream,) = [line.strip() for line in info.splitlines() if "Audio:" in line]
    return stream


def _decoded_samples(path: str) -> int:
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", path, "-map", "0:a:0", "-f", "f32le",
                          "-acodec", "pcm_f32le", "-"], capture_output=True, check=True).stdout
    return len(raw) // 4 // 2  # float32, stereo


def _check_published_sound(job, samples: int) -> dict:
    """The MP4's AAC track and the WAV hold the clip's sound at its rate; returns the sidecar."""
    stream = _audio_stream(job.media)
    assert "aac" in stream and f"{RATE} Hz" in stream and "stereo" in stream
    assert _decoded_samples(job.media) == samples
    with wave.open(job.wav) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getnframes()) == (RATE, 2, samples)
    record = json.loads(storage.sidecar_path(job.media).read_text())
    assert record["sound"] == {"sampling_rate": RATE, "channels": 2, "samples": samples, "duration": samples / RATE}
    wav_bytes = Path(job.wav).read_bytes()
    assert record["wav"] == {"file": Path(job.wav).name, "sha256": hashlib.sha256(wav_bytes).hexdigest(),
                             "bytes": len(wav_bytes)}
    assert record["media"]["sha256"] == hashlib.sha256(Path(job.media).read_bytes()).hexdigest()
    return record


def test_a_real_render_with_sound_is_muxed_and_written_as_wav(cluster, tmp_path):
    root = make_tiny_checkpoint(tmp_path / "tiny", sound=True)
    path = write_manifest(tmp_path, [{"id": "clip", "prompt": "a red robot", "outputs": ["mp4", "wav"]}],
                          model={"checkpoint": str(root)}, defaults=CLIP)
    m = manifest.load(path)
    (job,) = m.jobs
    _render(m, cosmos3_factory, job)
    _check_published_sound(job, samples=3000)
    assert storage.check_published(job.files, job.config_hash, ("run-1", 1)) is None


def test_the_sidecar_commits_the_wav_too(cluster, tmp_path):
    m = manifest.load(write_manifest(tmp_path, [{"id": "clip", "prompt": "a", "outputs": ["mp4", "wav"]}],
                                     sound=True, defaults=CLIP))
    (job,) = m.jobs
    _render(m, fake.factory, job)
    _check_published_sound(job, samples=3000)
    assert storage.is_done(job)
    Path(job.wav).write_bytes(b"RIFF....")  # a WAV changed after publishing: the job is not done any more
    assert storage.check_published(job.files, job.config_hash) == "wav does not match its sidecar"
    Path(job.wav).unlink()
    assert storage.check_published(job.files, job.config_hash) == "wav missing"


def test_temps_of_every_file_of_a_job_are_discarded(tmp_path):
    m = manifest.load(write_manifest(tmp_path, [{"id": "clip", "prompt": "a", "outputs": ["mp4", "wav"]}],
                                     sound=True, defaults=CLIP))
    (job,) = m.jobs
    folder = Path(job.media).parent
    folder.mkdir(parents=True)
    for final in (*job.files, storage.sidecar_path(job.media)):
        storage.temp_path(Path(final)).write_bytes(b"partial")
    assert storage.discard_temps(job) == 3 and not list(folder.iterdir())


def test_sound_asked_of_a_checkpoint_without_it_fails_the_job_and_publishes_nothing(cluster, tmp_path):
    """What a worker does with a request the manifest would have refused (say, written by an older driver)."""
    m = manifest.load(write_manifest(tmp_path, [{"id": "clip", "prompt": "a"}], defaults=CLIP))
    (job,) = m.jobs
    loud = dataclasses.replace(job, request=dataclasses.replace(job.request, sound=True),
                               wav=str(Path(job.media).with_suffix(".wav")))
    with pytest.raises(ray.exceptions.RayTaskError, match=r"sound: this checkpoint cannot generate sound "
                                                          r"\(its transformer has sound_gen=false\)"):
        _render(m, fake.factory, loud)
    assert not Path(job.media).parent.exists() or not list(Path(job.media).parent.iterdir())  # nothing, not even temps


def test_a_wav_asked_of_a_silent_render_publishes_nothing(cluster, tmp_path):
    m = manifest.load(write_manifest(tmp_path, [{"id": "clip", "prompt": "a", "sound": False}], sound=True,
                                     defaults=CLIP))
    (job,) = m.jobs
    with_wav = dataclasses.replace(job, wav=str(Path(job.media).with_suffix(".wav")))
    with pytest.raises(ray.exceptions.RayTaskError, match=r"asks for clip_s0.wav, but the render came back silent"):
        _render(m, fake.factory, with_wav)
    assert not Path(job.media).parent.exists() or not list(Path(job.media).parent.iterdir())  # nothing, not even temps


def test_the_fake_hums_only_where_the_checkpoint_has_sound(tmp_path):
    request = RenderRequest(task="t2v", prompt="a", width=32, height=32, frames=9, fps=24.0, steps=1)
    loud = fake.factory(manifest.load(write_manifest(tmp_path / "a", [{"id": "x", "prompt": "a"}], sound=True)).model,
                        False)(request, lambda *_: None)
    silent = fake.factory(manifest.load(write_manifest(tmp_path / "b", [{"id": "x", "prompt": "a"}])).model,
                          False)(request, lambda *_: None)
    assert loud.sound.shape == (2, 3000) and loud.sampling_rate == RATE
    assert silent.sound is None and silent.sampling_rate is None
    assert np.abs(loud.sound).max() > 0
