"""RenderWorker: one Ray actor per GPU. It loads a pipeline once, then renders, publishes and reports jobs.

The actor returns a small dict, never frames: media go straight to shared storage (`farm.storage.publish`),
so the object store never carries video. The pipeline comes from a *factory* so tests and benchmarks can
render with a fake; the default factory builds `cosmos3.pipeline.Cosmos3Pipeline`, importing torch only
inside the actor, never in the driver.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import resource
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

import ray
import structlog

from cosmos3.errors import BackgroundLoadError, CheckpointError, SoundTokenizerLoadError
from cosmos3.rules import checkpoint_identity
from cosmos3.rules.request import RenderRequest
from farm import metrics, storage
from farm.errors import InputChanged, JobFault, WorkerStartError
from farm.job import Job, ModelSpec
from worker import bytecode, encode, gpu_telemetry
from worker.gpu import check_assignment, check_gpu_memory, configure_cuda_allocator, cuda_device_facts

log = structlog.get_logger("farm.worker")


class Output(Protocol):
    frames: Any  # numpy uint8 [T, H, W, 3]
    fps: float
    # seconds: {"vae_wait" (for a VAE built in the background; None where nothing is), "tokenize", "vae_encode"
    # (None without conditioning), "und", "steps": [...], "vae_decode", "total"}
    timings: dict
    info: dict  # {"precision": ..., "fp8_accumulation": ..., "step_policy": ..., "cache": ..., "checkpoint": ...}
    memory: dict  # peak GPU bytes, see MEMORY_FIELDS (None where they do not apply)
    sound: Any  # numpy float32 [channels, N], or None for a silent render
    sampling_rate: int | None  # Hz of `sound`


# Every sidecar carries these keys; a figure that does not apply (GPU memory on a CPU worker, a fake
# renderer's checkpoint read) is None, so sidecars of every worker have one shape. "vae" and "sound_tokenizer" are
# their builds' own seconds, which on a cosmos3 worker run in the background, beside the rest and after ready()
# (the sound tokenizer's is None on a silent checkpoint); "tokenizer" is the text tokenizer's own, beside the
# transformer's load; "total" is the pipeline's load until it was ready; the sidecar's "warm_up" the renderer's
# warm-up after it (the background builds waited for, the decoder's set-up), and "worker" the whole start until
# ready(), the warm-up included.
WORKER_START_FIELDS = ("ops", "tokenizer", "build", "attention_kernels", "checkpoint_read", "checkpoint_bytes",
                       "checkpoint_gb_per_s", "vae", "sound_tokenizer", "total")
MEMORY_FIELDS = ("resident_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "stage_peak_allocated_bytes",
                 "vae_decode_tiled")


StepCallback = Callable[[int, int], None]  # (step, num_steps), after each denoising step


class Renderer(Protocol):
    device: str
    facts: dict  # where it renders, for the sidecar: GPU UUID, where the CUDA ops came from and how long they took
    load_timings: dict  # seconds (and bytes) per stage of loading the model, see WORKER_START_FIELDS

    def warm_up(self) -> None:
        """Pays at the worker's start what its first job would otherwise pay (builds, a GPU's set-up per size)."""

    def __call__(self, request: RenderRequest, callback: StepCallback, frames: encode.Mp4Stream | None = None
                 ) -> Output:
        """``frames``: a clip's MP4 encode, which a renderer may feed as it decodes (``cosmos3.pipeline.FrameSink``;
        one it never started encodes the whole clip at the publish). Raises cosmos3's PipelineError for a request it
        refuses: the job's fault, not the worker's; and
        cosmos3's BackgroundLoadError when what it loads after start failed: the worker's start, not the job (its
        SoundTokenizerLoadError only for a job with sound: that job cannot render on any worker)."""


PipelineFactory = Callable[[ModelSpec, bool], Renderer]  # (model, the actor holds a GPU) -> renderer


class _Cosmos3Renderer:
    def __init__(self, pipeline, device: str, facts: dict):
        self._pipeline, self.device, self.facts = pipeline, device, facts

    @property
    def load_timings(self) -> dict:
        return self._pipeline.load_timings  # its "vae" is known once the background build has ended

    def warm_up(self) -> None:
        self._pipeline.warm_up()

    def __call__(self, request: RenderRequest, callback: StepCallback, frames: encode.Mp4Stream | None = None
                 ) -> Output:
        return self._pipeline(request, callback=callback, frames=frames)


PROGRESS_EVERY = 10.0  # seconds between a long job's progress lines


class StepProgress:
    """The pipeline's step callback for one job: the dashboard's progress gauge after every step, and a
    `job_progress` log line at most every PROGRESS_EVERY seconds and after the last step. Ray streams the
    worker's log to the `farm submit` console, so a 3-minute clip shows where it is and when it will end."""

    def __init__(self, gauge: metrics.WorkerProgress, key: str, clock: Callable[[], float] = time.monotonic):
        self._gauge, self._key, self._clock = gauge, key, clock
        self._started = self._last = clock()

    def __call__(self, step: int, num_steps: int) -> None:
        self._gauge.step(step, num_steps)
        now, done = self._clock(), step + 1
        if done == num_steps or now - self._last >= PROGRESS_EVERY:
            self._last = now
            elapsed = now - self._started
            log.info("job_progress", key=self._key, step=done, steps=num_steps, elapsed_s=round(elapsed, 1),
                     eta_s=round(elapsed / done * (num_steps - done), 1))


def cosmos3_factory(model: ModelSpec, gpu: bool) -> Renderer:
    """The real pipeline, on the actor's GPU (Ray sets CUDA_VISIBLE_DEVICES, so it is `cuda`)."""
    import torch  # here, not at the top: the driver imports this module and may have no torch

    from cosmos3 import ops
    from cosmos3.pipeline import Cosmos3Pipeline

    # A logical GPU without CUDA only happens in tests (`ray.init(num_gpus=N)` on a CPU machine);
    # the device is reported by `ready()` and the driver warns about it.
    device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    # The kernels load here, not on the first job: a node that cannot load them fails at start, and says why.
    facts = {**cuda_device_facts(), "ops": ops.load_cuda_ops().facts()} if device == "cuda" else {}
    # The load options (parallel axes among them) are checked by the loader, the worker's only guard. The VAE
    # builds in the background: the worker is ready without it, and its first job waits for it where it needs it.
    pipeline = Cosmos3Pipeline.from_pretrained(model.checkpoint, device=device, vae_load="background",
                                               **dataclasses.asdict(model.options))
    return _Cosmos3Renderer(pipeline, device, facts)


def _measure(model: ModelSpec) -> checkpoint_identity.Fingerprint:
    """The checkpoint's files as this worker finds them, hashing only versions the driver did not hash.

    # Raises: WorkerStartError when they are not the checkpoint the driver fingerprinted, or cannot be read.
    """
    root = Path(model.checkpoint)
    try:
        found = checkpoint_identity.fingerprint(root, model.files)
    except CheckpointError as err:
        raise WorkerStartError(f"checkpoint {root}: {err}") from None
    if found.sha256 != model.fingerprint:
        differ = sorted(rel for rel in found.files.keys() | model.files.keys()
                        if (found.files.get(rel) or {}).get("sha256") != (model.files.get(rel) or {}).get("sha256"))
        raise WorkerStartError(
            f"checkpoint {root} changed since farm submit fingerprinted it ({', '.join(differ[:5]) or 'its files'} "
            f"differ): a render of these weights would be published as the other's; run farm submit again once the "
            f"checkpoint is what you want rendered (renders of the old weights then count as not done)")
    return found


def _check_inputs(job: Job) -> None:
    """The job's image or video is still the file its config hash was made from: a render made from another file
    would be published, and counted done, under that hash (and again after the file is put back).

    # Raises: InputChanged naming the file and the fix.
    """
    for path, sha256 in job.inputs:
        try:
            same = storage.input_sha256(path) == sha256
        except OSError:
            same = False
        if not same:
            raise InputChanged(f"{path} is not the file farm submit hashed into job {job.key}'s config hash (it "
                               f"changed, or was removed, since); run farm submit again to render from it as it is")


def _out_of_memory() -> tuple[type[BaseException], ...]:
    """Host and GPU out-of-memory errors; torch's only where this process imported it (a fake renderer does not)."""
    torch = sys.modules.get("torch")
    return (MemoryError,) if torch is None else (MemoryError, torch.OutOfMemoryError)


def settle_heap() -> None:
    """Collects garbage, then freezes what is left alive (``gc.freeze``): later collections skip it.

    A full collection walks every object the process tracks (torch, Ray, diffusers and the model; 0.36 s for
    the imports alone on a 2-core machine) with the GIL held. Between a render's steps the GPU then idles: in a
    farm run on the H200 one step of a still took 0.319 s instead of 0.016 s (benchmarks/results/h200-render.md),
    and each CUDA-graph capture runs one. Collecting first keeps garbage out of the frozen heap; a job's own is
    collected before the next job.
    """
    gc.collect()
    gc.freeze()


@dataclasses.dataclass(frozen=True)
class _Rendered:
    """A render waiting for its publish: the pipeline's output, its soundtrack, its clip's MP4 encode (under way
    since the decode began; None for a still), and when it started and ended."""

    output: Output
    sound: encode.Soundtrack | None
    clip: encode.Mp4Stream | None
    started: float  # time.time()
    rendered: float
    telemetry: dict  # the GPU's clock and power while it rendered, see gpu_telemetry.FIELDS


class RenderWorker:
    """Created by the driver with `ray.remote(RenderWorker).options(num_gpus=1, max_concurrency=2, ...)`: two calls at
    a time, a render and a publish or two publishes, never two renders (the driver's scheduler keeps to that)."""

    def __init__(self, model: ModelSpec, factory: PipelineFactory, origin: dict[str, Any], slot: int):
        """`origin`: the run id (`run`), the output root (`root`) and the manifest's path and sha256, recorded in
        every sidecar."""
        encode.sweep_orphaned_scratch()  # partial videos of workers killed on this node before
        started = time.perf_counter()
        context = ray.get_runtime_context()
        gpus = context.get_accelerator_ids().get("GPU", [])
        check_assignment(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if gpus:
            configure_cuda_allocator()
            check_gpu_memory(gpus[0], model.memory)  # before a byte of weights is read
        self._model = model
        self._loaded = _measure(model)  # before anything loads: the versions the renderer then reads
        self._renderer = factory(model, bool(gpus))
        warm_up = time.perf_counter()
        self._renderer.warm_up()  # ready() means warm: the first job pays no set-up a later one does not
        self._warm_up_seconds = time.perf_counter() - warm_up
        self._check_checkpoint()  # what the renderer read, its background builds included: they ended in warm_up
        self._gpu = self._renderer.device != "cpu"
        uuid = self._renderer.facts.get("gpu_uuid")
        self._telemetry = gpu_telemetry.open_device(uuid) if self._gpu and uuid else None
        self._ready_seconds = time.perf_counter() - started
        self._origin = origin
        self._progress = metrics.WorkerProgress(slot, origin["name"])
        self._gpu_gauges = metrics.WorkerGpu(slot, origin["name"]) if self._telemetry is not None else None
        self._rendered: dict[tuple[str, int], _Rendered] = {}  # (job key, attempt) -> a render its publish takes
        self._identity = {
            "slot": slot, "node": context.get_node_id(), "host": socket.gethostname(),
            "gpu": list(gpus), "device": self._renderer.device, "pid": os.getpid(), **self._renderer.facts,
            # packages this start compiled from source (every start will): a node's setup problem, not the job's
            "uncached_bytecode": bytecode.uncached(),
        }
        if self._identity["uncached_bytecode"]:
            log.warning("worker_start_compiled_python", packages=self._identity["uncached_bytecode"],
                        seconds=round(self._ready_seconds, 1), fix=bytecode.FIX)

    def ready(self) -> dict[str, Any]:
        """Answers once the pipeline is loaded: where this worker runs."""
        return self._identity

    def _check_checkpoint(self) -> None:
        """The checkpoint's files are still the versions measured before the load, or, touched, the same bytes: so
        what this worker loaded is what the driver fingerprinted. Once loaded, the weights are in memory: a later
        change of the files is no change of this worker's renders (a worker that starts after it refuses it).

        # Raises: WorkerStartError naming the files that changed and the fix.
        """
        try:
            same = not checkpoint_identity.changed(Path(self._model.checkpoint), self._loaded)
        except CheckpointError:  # its index no longer lists its files: measured again, which names the problem
            same = False
        if not same:
            self._loaded = _measure(self._model)

    def render(self, job: Job, attempt: int) -> dict[str, Any]:
        """Renders `job` and keeps its output for `publish`; returns as soon as the GPU is free for the next job."""
        settle_heap()  # before the job's clock
        started = time.time()
        gauges = self._gpu_gauges
        _check_inputs(job)  # what the renderer is about to read is what the config hash took
        # A clip's MP4 encodes beside its decode, fed chunk by chunk; the publish waits for its end.
        clip = None if job.request.task == "t2i" else encode.Mp4Stream()
        try:
            with gpu_telemetry.Sampler(self._telemetry, on_sample=None if gauges is None else gauges.sample) as sampler:
                output = self._run(job, clip)
            _check_inputs(job)  # and it did not change while the renderer read it
            sound = None if output.sound is None else encode.Soundtrack(output.sound, output.sampling_rate)
            if job.wav is not None and sound is None:  # the manifest asks for sound whenever it asks for a WAV
                raise RuntimeError(f"job {job.key} asks for {Path(job.wav).name}, but the render came back silent")
        except BaseException:
            if clip is not None:  # the render failed: its encode stops and leaves nothing behind
                clip.close()
            raise
        telemetry = sampler.summary()
        if gauges is not None:
            gauges.job(telemetry)
        self._rendered[(job.key, attempt)] = _Rendered(output, sound, clip, started, time.time(), telemetry)
        return {"key": job.key, "attempt": attempt}

    def _run(self, job: Job, clip: encode.Mp4Stream | None) -> Output:
        """The renderer's call, its failures told apart for the driver."""
        try:
            return self._renderer(job.request, StepProgress(self._progress, job.key), frames=clip)
        except SoundTokenizerLoadError:  # this job's sound, on every worker: the driver refuses the job
            raise
        except BackgroundLoadError as err:  # the driver treats it as this worker's failed start
            raise WorkerStartError(str(err)) from None
        except _out_of_memory() as err:  # the job's size, not the worker: the driver does not count it against it
            raise JobFault(f"{type(err).__name__}: {err}") from None

    def publish(self, job: Job, attempt: int) -> dict[str, Any]:
        """Publishes what `render` kept for this attempt: media (its sound muxed in), the WAV if asked, then the
        sidecar; if a later file fails, the earlier ones are removed again (`storage.Publication`). Runs beside
        the worker's next render (the actor has two threads), so the GPU does not wait for an encode. Returns a
        small summary for the driver."""
        kept = self._rendered.pop((job.key, attempt))
        output, sound, clip = kept.output, kept.sound, kept.clip
        encoded: list[float] = []

        def write(out: IO[bytes]) -> None:
            encode.write_media(output.frames, output.fps, out, image=clip is None, sound=sound, stream=clip)
            streamed = clip is not None and clip.seconds is not None  # since its decode began, beside it
            encoded.append(clip.seconds if streamed else time.time() - publish_started)

        publish_started = time.time()
        try:
            with storage.Publication(self._origin["root"]) as publication:
                media = publication.file(Path(job.media), write)
                wav = None if job.wav is None else publication.file(Path(job.wav),
                                                                    lambda out: encode.write_wav(sound, out))
                finished = time.time()
                # publish: an encode's part after the render (a still's whole), then hashing, fsync and the renames
                timings = {**output.timings, "media_encode": encoded[0], "publish": finished - publish_started}
                figures = self._figures(kept, timings)
                record = storage.sidecar_record(
                    job, self._origin["run"], attempt, media, wav, sound=None if sound is None else sound.record(),
                    manifest=self._origin, worker=self._identity,
                    checkpoint=checkpoint_identity.identity(self._model.checkpoint, self._model.fingerprint),
                    precision=output.info.get("precision"),
                    fp8_accumulation=output.info.get("fp8_accumulation"), step_policy=output.info.get("step_policy"),
                    attention=output.info.get("attention"), cache=output.info.get("cache"),
                    started=kept.started, finished=finished, **figures,
                )
                publication.json(storage.sidecar_path(job.media), record)
        finally:
            if clip is not None:
                clip.close()  # its scratch; ffmpeg too where the publish failed before the encode ended
        return {"key": job.key, "attempt": attempt, "sha256": media[0], "figures": figures,
                "started": kept.started, "finished": time.time()}

    def _figures(self, kept: _Rendered, timings: dict[str, Any]) -> dict[str, Any]:
        measured = kept.output.memory
        return {
            "timings": timings,
            "memory": {k: measured.get(k) for k in MEMORY_FIELDS},
            "gpu_seconds": kept.rendered - kept.started if self._gpu else None,  # the GPU is free once rendered
            "gpu_telemetry": kept.telemetry,
            "cuda_graphs": kept.output.info.get("cuda_graphs"),  # a job's graph captures and replays (GPU jobs)
            "worker_start": self._worker_start(),
        }

    def _worker_start(self) -> dict[str, Any]:
        """The start's figures, read per job: the VAE's seconds arrive when its background build ends. The host's
        peak RSS of this process so far (Linux reports KiB) says whether a load held a second copy of the weights."""
        loaded = self._renderer.load_timings
        return {**{k: loaded.get(k) for k in WORKER_START_FIELDS}, "warm_up": self._warm_up_seconds,
                "worker": self._ready_seconds,
                "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
