"""A manifest rendered end to end by the real Cosmos3 pipeline on tiny checkpoints (CPU), through the farm.

Two checkpoints: the tiny BF16 one (tests/tiny_checkpoint.py) and its static-FP8 export with the published
step policy, the path a Nano FP8 checkpoint takes. Workers hold logical GPUs and render on the CPU, with their
VAE built in the background as on a GPU; a VAE that does not build stalls the run as a worker that cannot start,
a sound tokenizer that does not build fails only the jobs with sound.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import imageio.v3 as iio
import imageio_ffmpeg
import numpy as np
import pytest
from safetensors import safe_open

from cosmos3.checkpoint.fp8_export import export_fp8
from cosmos3.checkpoint.weights import SKIPPED
from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest
from cosmos3.rules.checkpoint_header import DIFFUSERS_WEIGHTS as WEIGHTS
from farm import driver, manifest, storage
from farm.errors import ManifestError
from tests.farm.helpers import events, local_cluster, output_files, write_manifest
from tests.tiny_checkpoint import make_tiny_checkpoint, mismatch_weights
from worker import encode

PROMPT = "a red robot walks through a city at night"
JOBS = [
    {"id": "clip", "prompt": PROMPT, "size": [48, 32], "frames": 9},
    {"id": "still", "task": "t2i", "prompt": "a blue car on a street", "size": [32, 32]},
    {"id": "extend", "task": "i2v", "prompt": PROMPT, "image": "inputs/frame.png"},
    {"id": "restyle", "task": "v2v", "prompt": PROMPT, "video": "inputs/clip.mp4", "frames": 13},
]


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(num_gpus=2, num_cpus=4):
        yield


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    bf16 = make_tiny_checkpoint(tmp_path_factory.mktemp("bf16") / "ckpt")

    # ModelOpt calibrates on a real render of our pipeline (its default: the published step policy).
    calibration = [RenderRequest(task="t2v", prompt=PROMPT, width=48, height=32, frames=9, steps=2)]
    fp8 = export_fp8(bf16, tmp_path_factory.mktemp("fp8") / "ckpt", calibration, max_shard_size="64KB")
    return {"bf16": bf16, "fp8-static": fp8}


def _inputs(folder: Path) -> None:
    (folder / "inputs").mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 256, size=(7, 32, 32, 3), dtype=np.uint8)
    iio.imwrite(folder / "inputs" / "frame.png", pixels[0])
    encode.write_mp4(pixels, 24.0, folder / "inputs" / "clip.mp4")


def _mp4_shape(path: Path) -> tuple[int, int, int]:
    reader = imageio_ffmpeg.read_frames(str(path))
    width, height = next(reader)["size"]
    return sum(1 for _ in reader), height, width


FIGURES = ("timings", "memory", "gpu_seconds", "gpu_telemetry", "cuda_graphs", "worker_start")


def checkpoint_bytes(root: Path) -> int:
    """What loading the transformer must read: every stored tensor but the ones generation never uses."""
    total = 0
    for shard in sorted((root / "transformer").glob("*.safetensors")):
        with safe_open(shard, framework="pt") as f:
            for key in f.keys():
                if key not in SKIPPED:
                    tensor = f.get_tensor(key)
                    total += tensor.numel() * tensor.element_size()
    return total


def _assert_cpu_figures(record: dict, job, read_bytes: int) -> None:
    """Every per-stage figure is in the sidecar; GPU-only ones are null on a worker rendering on the CPU."""
    timings = record["timings"]
    assert set(timings) == {"vae_wait", "tokenize", "vae_encode", "und", "steps", "vae_decode", "total",
                            "media_encode", "publish"}
    assert (timings["vae_encode"] is None) is (job.request.task in ("t2v", "t2i"))
    assert all(timings[k] > 0 for k in ("tokenize", "und", "vae_decode", "media_encode", "publish"))
    if job.request.task == "t2i":  # a still's PNG is encoded inside its publish; a clip's MP4 beside its decode
        assert timings["publish"] > timings["media_encode"]
    assert timings["total"] >= sum(timings["steps"]) + timings["vae_decode"] + timings["und"]
    stages = ("vae_encode", "und", "steps", "vae_decode")
    assert record["memory"] == {"resident_bytes": None, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
                                "stage_peak_allocated_bytes": dict.fromkeys(stages),
                                "vae_decode_tiled": False}  # host memory: always the untiled reference
    assert record["gpu_seconds"] is None  # a logical GPU without CUDA renders on the CPU
    assert record["gpu_telemetry"] == {"samples": None, "sm_clock_mhz_median": None, "sm_clock_mhz_min": None,
                                       "power_w_mean": None, "power_limit_w": None, "power_capped_share": None,
                                       "thermal_share": None}  # nothing to sample
    assert record["cuda_graphs"] is None  # graphs are CUDA's
    start = record["worker_start"]
    assert start["ops"] is None and start["checkpoint_bytes"] == read_bytes
    assert start["checkpoint_read"] > 0 and start["checkpoint_gb_per_s"] > 0
    assert start["attention_kernels"] >= 0
    # The VAE is built in the background, beside the transformer's load; the worker's warm-up waits for it before
    # ready(). The text tokenizer loads beside the transformer, and the start waits for both.
    assert start["worker"] >= start["total"] >= start["checkpoint_read"] + start["build"] + start["attention_kernels"]
    assert start["worker"] >= start["warm_up"] >= 0
    assert start["total"] >= start["tokenizer"] > 0
    assert start["vae"] > 0 and timings["vae_wait"] >= 0


@pytest.mark.parametrize("precision", ["bf16", "fp8-static"])
def test_a_manifest_renders_end_to_end_with_the_real_pipeline(cluster, checkpoints, tmp_path, precision):
    _inputs(tmp_path)
    fp8 = precision == "fp8-static"
    cache = {"method": "seacache", "threshold": 0.3, "max_consecutive": 1}
    model = {"checkpoint": str(checkpoints[precision]), "cache": cache, **({"fp8_accumulation": "fp32"} if fp8 else {})}
    path = write_manifest(tmp_path, JOBS, model=model,
                          defaults={"size": [32, 32], "steps": 3, "frames": 9, "retries": 0})
    m = manifest.load(path)
    # One worker: each one imports torch and loads the model, which dominates on a 2-core CI machine.
    report = driver.submit(m, driver.SubmitOptions(workers=1, progress=False))
    waits = []

    assert report.ok, report.outcomes
    assert m.model.static_fp8 is fp8
    assert len(output_files(tmp_path / "out")) == 2 * len(JOBS)
    for job in m.jobs:
        record = json.loads(storage.sidecar_path(job.media).read_text())
        assert record["precision"] == precision
        assert record["fp8_accumulation"] == ("fp32" if fp8 else None)  # the manifest's option reached the worker
        # the manifest's cache reached the worker, stills' and clips'; the sidecar says which steps it computed and
        # cached
        assert {k: record["cache"][k] for k in cache} == cache
        assert sorted(record["cache"]["computed"] + record["cache"]["cached"]) == list(range(job.request.steps))
        # the checkpoint the config hash holds, not a second identity
        assert record["checkpoint"] == {"path": m.model.checkpoint, "fingerprint": m.model.fingerprint}
        assert (record["step_policy"] is not None) is (precision == "fp8-static")
        request = job.request
        assert len(record["timings"]["steps"]) == request.steps
        if request.task != "t2i":
            assert _mp4_shape(Path(job.media)) == (request.frames, request.height, request.width)
        _assert_cpu_figures(record, job, checkpoint_bytes(Path(m.model.checkpoint)))
        waits.append(record["timings"]["vae_wait"])
        # The run summary carries the same figures for every job.
        summary = json.loads(Path(report.summary_path).read_text())
        assert summary["jobs"][job.key]["figures"] == {k: record[k] for k in FIGURES}
    assert waits == [0.0] * len(JOBS)  # the worker's warm-up waited for the VAE before it was ready

    # PNG is lossless: the farm's still is exactly what the pipeline renders when called directly.
    still = next(job for job in m.jobs if job.request.task == "t2i")
    direct = Cosmos3Pipeline.from_pretrained(checkpoints[precision], device="cpu")(still.request)
    assert np.array_equal(iio.imread(still.media), direct.frames[0])


def test_a_vae_without_weights_is_refused_before_the_run(checkpoints, tmp_path):
    """What a worker's start would find without diffusers, the manifest's validation finds first."""
    root = tmp_path / "broken"
    shutil.copytree(checkpoints["bf16"], root)
    (root / "vae" / WEIGHTS).unlink()
    path = write_manifest(tmp_path, JOBS[:2], model={"checkpoint": str(root)}, defaults={"size": [32, 32], "steps": 2})
    with pytest.raises(ManifestError, match=rf"model -> checkpoint: \S+/vae: no {WEIGHTS}"):
        manifest.load(path)


def test_a_vae_only_diffusers_can_refuse_stalls_the_run_as_a_worker_that_cannot_start(cluster, checkpoints, tmp_path):
    """A VAE only diffusers can refuse fails after ready(), and the run sees it as a worker that cannot start."""
    root = tmp_path / "broken"
    shutil.copytree(checkpoints["bf16"], root)
    mismatch_weights(root, "renamed")
    path = write_manifest(tmp_path, JOBS[:2], model={"checkpoint": str(root)}, defaults={"size": [32, 32], "steps": 2})
    report = driver.submit(manifest.load(path), driver.SubmitOptions(workers=1, progress=False))
    cause = (rf"WorkerStartError: \S+/vae: the VAE did not build: CheckpointError: \S+/vae/{WEIGHTS}: "
             "does not match vae/config.json")

    kinds = [e["event"] for e in events(tmp_path / "out")]
    assert not report.ok and not output_files(tmp_path / "out")
    assert {(o.state, o.attempts) for o in report.outcomes.values()} == {("pending", 0)}
    stalled = report.outcomes["clip"].error
    assert re.search(f"last: worker 0 could not start: {cause}", stalled), stalled
    # One worker, one failed start: the budget (one per worker) is spent, so the slot is retired.
    assert (kinds.count("worker_init_failed"), kinds.count("worker_retired")) == (1, 1)
    assert (kinds.count("worker_ready"), kinds.count("job_requeued")) == (1, 1)


def test_a_sound_tokenizer_only_diffusers_can_refuse_fails_the_jobs_with_sound_and_renders_the_rest(cluster, tmp_path):
    """The real worker: its sound tokenizer does not build after ready(); the clip with sound is refused once, the
    silent clip and the still render, and the worker never restarts."""
    root = make_tiny_checkpoint(tmp_path / "broken", sound=True)
    mismatch_weights(root, "misshapen", "sound_tokenizer")
    jobs = [JOBS[0], {**JOBS[0], "id": "silent", "sound": False}, JOBS[1]]
    path = write_manifest(tmp_path, jobs, model={"checkpoint": str(root)}, defaults={"size": [32, 32], "steps": 2})
    report = driver.submit(manifest.load(path), driver.SubmitOptions(workers=1, progress=False))

    assert {key: (o.state, o.attempts) for key, o in report.outcomes.items()} == {
        "clip": ("failed", 1), "silent": ("done", 1), "still": ("done", 1)}
    refused = report.outcomes["clip"].error
    assert re.match(r"SoundTokenizerLoadError: \S+/sound_tokenizer: the sound tokenizer did not build: "
                    r"CheckpointError: .*re-export the checkpoint's sound_tokenizer/ folder", refused, re.S), refused
    kinds = [e["event"] for e in events(tmp_path / "out")]
    assert (kinds.count("worker_ready"), kinds.count("worker_init_failed"), kinds.count("job_requeued")) == (1, 0, 0)
    assert output_files(tmp_path / "out") == ["test/silent_s0.mp4", "test/silent_s0.mp4.json", "test/still_s0.png",
                                              "test/still_s0.png.json"]
