"""Pipeline factories that misbehave on cue, for the scheduler's failure paths.

The renderer acts on words in a job's prompt: `fail` raises on every attempt, `fail-on-gpu-0` on logical GPU 0
only (a bad GPU), `out-of-memory` raises MemoryError as numpy does for an array too large, `hang` never returns;
`crash-once` kills the worker process (`os._exit`) and `hang-once` never returns, on a job's first attempt only
(a marker file in `markers` remembers it across worker processes); `wait-for PATH` holds the job until the file PATH
exists, so a test decides when it may finish. Otherwise it is `worker.fake`'s sleeping renderer.

Factories that fail a worker's start do it in `__init__` (`bad_gpu_zero`, `no_gpu_works`) or, as a GPU worker whose
VAE's background build failed, in every job after `ready()` (`vae_fails_on_gpu_zero`, `no_vae_loads`);
`no_sound_tokenizer_loads` fails only the jobs with sound, as a worker whose sound tokenizer did not build.
`publish_beside_render` holds one seed's publish beside the next seed's render (and can crash or hang them there).
`every_worker_first` finishes no job before every worker of the run has begun one.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import ray

from cosmos3.errors import SoundTokenizerLoadError, VAELoadError
from cosmos3.rules.request import RenderRequest, RequestRules, resolve
from worker.fake import FakeRenderer


def _first_time(markers: str, name: str) -> bool:
    """True exactly once per name across every process (O_EXCL creation is atomic)."""
    try:
        os.close(os.open(Path(markers) / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class ScriptedRenderer(FakeRenderer):
    def __init__(self, rules: RequestRules, markers: str, seconds_per_step: float):
        super().__init__(rules, seconds_per_step)
        self.markers = markers

    def __call__(self, request: RenderRequest, callback, frames=None):
        words = request.prompt.split()
        once = f"{request.prompt}-{request.seed}".replace(" ", "_").replace("/", "_")
        if "fail" in words or ("fail-on-gpu-0" in words and _on_gpu_zero()):
            raise RuntimeError(f"scripted failure of seed {request.seed}")
        if "out-of-memory" in words:
            raise MemoryError("Unable to allocate 7.28 TiB for an array with shape (1048576, 1048576, 8) (scripted)")
        if "crash-once" in words and _first_time(self.markers, once):
            os._exit(1)
        if "hang" in words or ("hang-once" in words and _first_time(self.markers, once)):
            time.sleep(3600)
        if "wait-for" in words:
            gate = Path(words[words.index("wait-for") + 1])
            while not gate.exists():  # the test opens the gate; a killed worker never sees it
                time.sleep(0.05)
        return super().__call__(request, callback, frames)


def scripted(model, gpu: bool, *, markers: str, seconds_per_step: float = 0.01) -> ScriptedRenderer:
    return ScriptedRenderer(RequestRules.from_checkpoint(model.checkpoint), markers, seconds_per_step)


def gated(model, gpu: bool, *, seconds_per_step: float = 0.01) -> ScriptedRenderer:
    """`scripted` without markers (for `farm submit --pipeline tests.farm.fakes:gated`): `wait-for` only."""
    return ScriptedRenderer(RequestRules.from_checkpoint(model.checkpoint), "", seconds_per_step)


class VAELessRenderer(FakeRenderer):
    """Ready, but its VAE's build failed: every job raises VAELoadError, as Cosmos3Pipeline's do then."""

    def __init__(self, rules: RequestRules, checkpoint: str, seconds_per_step: float):
        super().__init__(rules, seconds_per_step)
        self.vae = Path(checkpoint) / "vae"

    def __call__(self, request: RenderRequest, callback, frames=None):
        raise VAELoadError(f"{self.vae}: the VAE did not build: CheckpointError: {self.vae}/"
                           "diffusion_pytorch_model.safetensors: does not match vae/config.json (scripted)")


class SoundlessRenderer(FakeRenderer):
    """Ready, but its sound tokenizer's build failed: a job with sound raises SoundTokenizerLoadError, as
    Cosmos3Pipeline's do then; silent jobs render."""

    def __init__(self, rules: RequestRules, checkpoint: str, seconds_per_step: float):
        super().__init__(rules, seconds_per_step)
        self.folder = Path(checkpoint) / "sound_tokenizer"

    def __call__(self, request: RenderRequest, callback, frames=None):
        if resolve(request, self.rules).sound_frames is not None:
            raise SoundTokenizerLoadError(f"{self.folder}: the sound tokenizer did not build: CheckpointError: "
                                          f"{self.folder}: cannot load the sound tokenizer (scripted)")
        return super().__call__(request, callback, frames)


def _on_gpu_zero() -> bool:
    return ray.get_runtime_context().get_accelerator_ids()["GPU"] == ["0"]


def bad_gpu_zero(model, gpu: bool, *, seconds_per_step: float = 0.01) -> FakeRenderer:
    """Fails to load on logical GPU 0, like a worker on a broken device."""
    if _on_gpu_zero():
        raise RuntimeError("CUDA error: uncorrectable ECC error encountered (GPU 0)")
    return FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step)


def vae_fails_on_gpu_zero(model, gpu: bool, *, seconds_per_step: float = 0.01) -> FakeRenderer:
    """Ready everywhere, but on logical GPU 0 its VAE did not build."""
    if _on_gpu_zero():
        return no_vae_loads(model, gpu, seconds_per_step=seconds_per_step)
    return FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step)


def no_vae_loads(model, gpu: bool, *, seconds_per_step: float = 0.01) -> VAELessRenderer:
    return VAELessRenderer(RequestRules.from_checkpoint(model.checkpoint), model.checkpoint, seconds_per_step)


def no_sound_tokenizer_loads(model, gpu: bool, *, seconds_per_step: float = 0.01) -> SoundlessRenderer:
    return SoundlessRenderer(RequestRules.from_checkpoint(model.checkpoint), model.checkpoint, seconds_per_step)


def no_gpu_works(model, gpu: bool) -> FakeRenderer:
    raise RuntimeError("CUDA error: no CUDA-capable device is detected")


def full_scratch(model, gpu: bool, *, seconds_per_step: float = 0.01) -> FakeRenderer:
    """Renders fine, but this worker's disks report no free space (ENOSPC before encoding)."""
    import os
    import types

    real = os.statvfs

    def statvfs(where):
        usage = real(where)
        return types.SimpleNamespace(**{**{k: getattr(usage, k) for k in dir(usage) if k.startswith("f_")},
                                        "f_bavail": 0, "f_bfree": 0})

    os.statvfs = statvfs  # in this worker's process only
    return FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step)


def truncating_once(model, gpu: bool, *, markers: str, seconds_per_step: float = 0.01) -> FakeRenderer:
    """Each job's first encode ends truncated, as when ffmpeg fails writing the trailer and says nothing."""
    from worker import encode

    real = encode._read_back_mp4

    def read_back(path, shape):
        # fake.paint gives each seed its own colour, so its own file: one marker per job of a sweep
        if _first_time(markers, f"truncate-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"):
            os.truncate(path, path.stat().st_size // 2)
        real(path, shape)

    encode._read_back_mp4 = read_back
    return FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step)


class _MarksSeedOne(FakeRenderer):
    """Marks seed 1's first render as begun (the marker `render-s1`). With `hold` ("crash" or "hang") it then waits
    for seed 0's first publish to be under way (the marker `publish-s0`), and kills its worker or never returns."""

    def __init__(self, rules: RequestRules, markers: str, hold: str | None, seconds_per_step: float):
        super().__init__(rules, seconds_per_step)
        self.markers, self.hold = Path(markers), hold

    def __call__(self, request: RenderRequest, callback, frames=None):
        if request.seed == 1 and _first_time(str(self.markers), "render-s1") and self.hold:
            _wait_for_file(self.markers / "publish-s0")
            if self.hold == "crash":
                os._exit(1)
            time.sleep(3600)
        return super().__call__(request, callback, frames)


class _WaitsForEveryWorker(FakeRenderer):
    """Its first render marks itself begun and holds until ``workers`` first renders have begun (5 minutes at most),
    so no job finishes before every worker is ready: a test counts the workers without racing a queue of short jobs
    (the driver hands a job to every ready worker while jobs are queued)."""

    def __init__(self, rules: RequestRules, markers: str, workers: int, seconds_per_step: float):
        super().__init__(rules, seconds_per_step)
        self.markers, self.workers, self.begun = Path(markers), workers, False

    def __call__(self, request: RenderRequest, callback, frames=None):
        if not self.begun:
            self.begun = True
            (self.markers / f"begun-{os.getpid()}").touch()
            deadline = time.monotonic() + 300
            while len(list(self.markers.glob("begun-*"))) < self.workers and time.monotonic() < deadline:
                time.sleep(0.02)
        return super().__call__(request, callback, frames)


def every_worker_first(model, gpu: bool, *, markers: str, workers: int,
                       seconds_per_step: float = 0.01) -> FakeRenderer:
    return _WaitsForEveryWorker(RequestRules.from_checkpoint(model.checkpoint), markers, workers, seconds_per_step)


def _wait_for_file(path: Path, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.exists()


def publish_beside_render(model, gpu: bool, *, markers: str, hold: str | None = None,
                          seconds_per_step: float = 0.01) -> FakeRenderer:
    """For a job of seeds 0 and 1 on one worker. Seed 0's first publish holds until seed 1's render has begun, which
    can only happen beside it, then marks `overlapped` (after 60 s it gives up unmarked). With `hold`, seed 0's first
    publish never returns, and seed 1's first render, once that publish is under way, kills the worker ("crash")
    or never returns either ("hang": the job's timeout kills the worker)."""
    from worker import encode

    real = encode.write_media

    def write_media(frames, fps, path, **kwargs):
        if "_s0." in path.name and _first_time(markers, "publish-s0"):
            if hold:
                time.sleep(3600)  # killed with its worker
            if _wait_for_file(Path(markers) / "render-s1"):
                (Path(markers) / "overlapped").touch()
        real(frames, fps, path, **kwargs)

    encode.write_media = write_media
    return _MarksSeedOne(RequestRules.from_checkpoint(model.checkpoint), markers, hold, seconds_per_step)
