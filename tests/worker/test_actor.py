"""RenderWorker as a Ray actor holding one logical GPU, with the fake pipeline."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import tempfile
import weakref
from pathlib import Path

import pytest
import ray
import structlog.testing

from cosmos3.rules.load_options import LoadOptions
from cosmos3.rules.request import RequestRules
from farm import manifest, storage
from farm.errors import InputChanged, WorkerStartError
from tests.farm import fakes
from tests.farm.helpers import local_cluster, output_files, render_and_publish, write_image, write_manifest
from worker import encode, fake, gpu
from worker.actor import RenderWorker, StepProgress, cosmos3_factory

TOY_FP8 = Path(__file__).resolve().parents[2] / "checkpoints" / "toy" / "fp8"
ORIGIN = {"run": "run-1", "path": "/m.yaml", "sha256": "abc", "name": "test"}


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(num_gpus=1, num_cpus=2):
        yield


def _manifest(tmp_path: Path) -> manifest.Manifest:
    jobs = [{"id": "clip", "prompt": "a red circle"}, {"id": "still", "task": "t2i", "prompt": "a blue square"}]
    return manifest.load(write_manifest(tmp_path, jobs))


def _worker(m: manifest.Manifest, factory=fake.factory):
    origin = {**ORIGIN, "root": m.output_root}
    Path(m.output_root).mkdir(exist_ok=True)  # the driver makes it at submit start; publishing never does
    return ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0).remote(m.model, factory, origin, 0)


def test_render_publishes_media_and_sidecar_and_returns_a_small_dict(cluster, tmp_path):
    m = _manifest(tmp_path)
    worker = _worker(m)
    identity = ray.get(worker.ready.remote())
    results = [render_and_publish(worker, job) for job in m.jobs]
    ray.kill(worker)

    assert identity["gpu"] == ["0"] and identity["slot"] == 0 and identity["node"]
    for job, result in zip(m.jobs, results, strict=True):
        assert set(result) == {"key", "attempt", "sha256", "figures", "started", "finished"}
        assert result["sha256"] == hashlib.sha256(Path(job.media).read_bytes()).hexdigest()
        record = json.loads(storage.sidecar_path(job.media).read_text())
        assert record["manifest"] == {**ORIGIN, "root": m.output_root} and record["worker"] == identity
        assert {"checkpoint", "precision", "step_policy"} <= set(record)
        assert len(record["timings"]["steps"]) == job.request.steps and record["timings"]["publish"] > 0
        assert storage.check_published(job.files, job.config_hash, ("run-1", 1)) is None
    assert Path(m.jobs[1].media).suffix == ".png"


def test_the_loader_is_the_workers_guard_against_sharded_static_fp8(cluster, tmp_path):
    """The worker passes `parallel` through Cosmos3Pipeline.from_pretrained; the loader refuses it."""
    m = manifest.load(write_manifest(tmp_path, [{"id": "clip", "prompt": "a red circle"}],
                                     model={"checkpoint": str(TOY_FP8)}))
    sharded = dataclasses.replace(m.model, options=LoadOptions(parallel={"tp_size": 1, "cfg_size": 2}))
    worker = ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0).remote(sharded, cosmos3_factory, ORIGIN, 0)
    with pytest.raises(ray.exceptions.ActorDiedError,
                       match=r"parallel.cfg_size: cosmos3 runs a model on one GPU .no parallel axis is built.; got "
                             r"parallel.cfg_size=2"):
        ray.get(worker.ready.remote())


def test_a_worker_that_would_see_every_gpu_of_its_node_is_refused_at_start(cluster, tmp_path):
    """Ray told not to set CUDA_VISIBLE_DEVICES (a node-wide setting): the worker would see the whole node."""
    m = _manifest(tmp_path)
    noset = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    worker = ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0, runtime_env=noset).remote(
        m.model, fake.factory, ORIGIN, 0)
    with pytest.raises(ray.exceptions.ActorDiedError, match="Ray assigned this worker GPU 0, but it sees"):
        ray.get(worker.ready.remote())


DEVICE_FACTS = {"gpu_uuid": "GPU-2daf2d03-1f3e-d7d2-f717-7e730d4ec67e", "gpu_name": "NVIDIA H200", "sm": 90,
                "ops": {"source": "prebuilt", "seconds": 0.001, "path": "/site/cosmos3/ops/_cuda_ops.so"}}


def _renderer_on_a_gpu(model, gpu: bool) -> fake.FakeRenderer:
    """What cosmos3_factory reports on a GPU node: the device and where its kernels came from."""
    renderer = fake.FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step=0.0)
    renderer.facts = DEVICE_FACTS
    return renderer


def test_the_sidecar_records_the_gpu_uuid_and_where_the_ops_came_from(cluster, tmp_path):
    m = _manifest(tmp_path)
    Path(m.output_root).mkdir(exist_ok=True)  # the driver makes it at submit start; publishing never does
    worker = ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0).remote(
        m.model, _renderer_on_a_gpu, {**ORIGIN, "root": m.output_root}, 0)
    identity = ray.get(worker.ready.remote())
    render_and_publish(worker, m.jobs[1])
    ray.kill(worker)
    record = json.loads(storage.sidecar_path(m.jobs[1].media).read_text())
    assert record["worker"] == identity and identity["gpu"] == ["0"]
    assert {key: record["worker"][key] for key in DEVICE_FACTS} == DEVICE_FACTS


class _Gauge:
    def __init__(self):
        self.seen = []

    def step(self, step, num_steps):
        self.seen.append((step, num_steps))


def test_a_long_job_logs_its_progress_every_ten_seconds_and_at_its_end():
    """A 3-minute clip shows per-step progress in the CLI (Ray streams worker logs) and the dashboard."""
    times = iter([0.0, 5.0, 11.0, 16.0, 22.0, 23.0])  # the start, then after each of five steps
    gauge = _Gauge()
    progress = StepProgress(gauge, "t2v", clock=lambda: next(times))
    with structlog.testing.capture_logs() as logs:
        for step in range(5):
            progress(step, 5)
    assert gauge.seen == [(i, 5) for i in range(5)]  # the gauge hears every step
    assert [(e["step"], e["elapsed_s"], e["eta_s"]) for e in logs] == [(2, 11.0, 16.5), (4, 22.0, 5.5), (5, 23.0, 0.0)]
    assert {e["event"] for e in logs} == {"job_progress"} and {e["key"] for e in logs} == {"t2v"}


def _renderer_reporting_its_allocator(model, gpu: bool) -> fake.FakeRenderer:
    renderer = fake.FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step=0.0)
    renderer.facts = {"allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    return renderer


def test_a_gpu_worker_sets_its_cuda_allocator_before_the_pipeline_loads(cluster, tmp_path):
    m = _manifest(tmp_path)
    worker = ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0).remote(
        m.model, _renderer_reporting_its_allocator, ORIGIN, 0)
    identity = ray.get(worker.ready.remote())
    ray.kill(worker)
    # this test process's value if it has one (the node's environment wins), else the worker's setting
    assert identity["allocator"] == os.environ.get("PYTORCH_CUDA_ALLOC_CONF", gpu.CUDA_ALLOC_CONF)


class _VAEBuiltAfterReady(fake.FakeRenderer):
    """Loads like a GPU worker's pipeline: its VAE's seconds are known only once the first job has waited for it.
    It refuses to render before its warm-up has run."""

    def __init__(self, rules: RequestRules):
        super().__init__(rules, seconds_per_step=0.0)
        self.load_timings = {"total": 1.0, "vae": None}
        self.warm = False

    def warm_up(self):
        self.warm = True

    def __call__(self, request, callback, frames=None):
        if not self.warm:
            raise RuntimeError("rendered before its warm-up")
        self.load_timings = {"total": 1.0, "vae": 2.5}
        return super().__call__(request, callback, frames)


def _renderer_with_a_background_vae(model, gpu: bool) -> _VAEBuiltAfterReady:
    return _VAEBuiltAfterReady(RequestRules.from_checkpoint(model.checkpoint))


def test_the_sidecar_reports_the_warm_up_and_the_vae_build_that_ended_after_ready(cluster, tmp_path):
    m = _manifest(tmp_path)
    worker = _worker(m, _renderer_with_a_background_vae)
    ray.get(worker.ready.remote())
    render_and_publish(worker, m.jobs[1])
    ray.kill(worker)
    start = json.loads(storage.sidecar_path(m.jobs[1].media).read_text())["worker_start"]
    assert (start["total"], start["vae"]) == (1.0, 2.5) and start["worker"] > 0
    assert start["worker"] >= start["warm_up"] >= 0  # the render above ran after the warm-up: it refuses otherwise


def test_a_vae_that_did_not_build_fails_the_job_as_the_workers_start(cluster, tmp_path):
    m = _manifest(tmp_path)
    worker = _worker(m, fakes.no_vae_loads)
    ray.get(worker.ready.remote())
    with pytest.raises(ray.exceptions.RayTaskError) as raised:
        ray.get(worker.render.remote(m.jobs[0], 1))
    ray.kill(worker)
    assert isinstance(raised.value.cause, WorkerStartError)
    assert str(raised.value.cause).startswith(f"{Path(m.model.checkpoint) / 'vae'}: the VAE did not build: ")
    assert output_files(Path(m.output_root)) == []


def test_a_render_starts_on_a_collected_and_frozen_heap(cluster, tmp_path):
    """A full collection of a worker's heap holds the GIL ~0.3 s, ten steps of a still: the worker collects
    before a render's clock starts and freezes what is alive, so collections during the steps skip it. Garbage
    made before the render is collected, not frozen."""

    class Node:
        pass

    seen = {}

    class Probe(fake.FakeRenderer):
        def __call__(self, request, callback, frames=None):
            seen.update(frozen=gc.get_freeze_count(), garbage_left=garbage() is not None)
            return super().__call__(request, callback, frames)

    m = _manifest(tmp_path)
    Path(m.output_root).mkdir(exist_ok=True)
    gc.disable()  # no automatic collection: only the worker's own can free the cycle
    try:
        cycle = Node()
        cycle.self = cycle
        garbage = weakref.ref(cycle)
        del cycle
        frozen_before = gc.get_freeze_count()
        worker = RenderWorker(m.model, lambda model, gpu: Probe(RequestRules.from_checkpoint(model.checkpoint), 0.0),
                              {**ORIGIN, "root": m.output_root}, 0)
        assert garbage() is not None  # the worker's start collects nothing
        worker.render(m.jobs[1], 1)
    finally:
        gc.unfreeze()
        gc.enable()
    assert not seen["garbage_left"] and seen["frozen"] > frozen_before


@pytest.mark.parametrize("when", ["before the render", "while it renders"])
def test_a_render_from_an_input_other_than_the_one_its_config_hash_took_is_refused(tmp_path, when):
    """An i2v job's image changed after farm submit hashed it into the job's config hash: a render made from it
    would be published, and counted done, under that hash (and again once the file is put back)."""
    image = write_image(tmp_path / "inputs" / "frame.png")
    m = manifest.load(write_manifest(tmp_path, [{"id": "i", "task": "i2v", "prompt": "x", "image": str(image)}]))
    Path(m.output_root).mkdir(exist_ok=True)

    def changed() -> None:
        image.write_bytes(image.read_bytes() + b"another file")

    class Swapping(fake.FakeRenderer):
        def __call__(self, request, callback, frames=None):
            changed()
            return super().__call__(request, callback, frames)

    renderer = Swapping if when == "while it renders" else fake.FakeRenderer
    worker = RenderWorker(m.model, lambda model, gpu: renderer(RequestRules.from_checkpoint(model.checkpoint), 0.0),
                          {**ORIGIN, "root": m.output_root}, 0)
    if when == "before the render":
        changed()
    with pytest.raises(InputChanged, match=f"{image} is not the file farm submit hashed into job i's config hash"):
        worker.render(m.jobs[0], 1)
    assert not Path(m.jobs[0].media).exists()


class _FailsMidDecode(fake.FakeRenderer):
    """Hands its clip's first chunk to the encode, then fails, as a decode that runs out of memory half-way."""

    def __call__(self, request, callback, frames=None):
        out = super().__call__(request, callback)
        frames.start(out.frames.shape, out.fps, None, None)
        frames.write(out.frames[:1])
        raise RuntimeError("the decode failed half-way")


def _fails_mid_decode(model, gpu: bool) -> _FailsMidDecode:
    return _FailsMidDecode(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step=0.0)


def test_a_clip_whose_decode_fails_mid_stream_stops_its_encode_and_publishes_nothing(cluster, tmp_path):
    m = _manifest(tmp_path)
    worker = _worker(m, _fails_mid_decode)
    pid = ray.get(worker.ready.remote())["pid"]
    with pytest.raises(ray.exceptions.RayTaskError, match="the decode failed half-way"):
        ray.get(worker.render.remote(m.jobs[0], 1))
    scratch = list(Path(tempfile.gettempdir()).glob(f"{encode._scratch_prefix()}{pid}-*"))  # the worker's encodes
    ray.kill(worker)
    assert scratch == [] and output_files(Path(m.output_root)) == []
