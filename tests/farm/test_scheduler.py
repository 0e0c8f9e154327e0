"""The driver loop on a local Ray cluster with logical GPUs, against fake pipelines (tests/farm/fakes.py)."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from farm import cluster as cluster_module
from farm import driver, manifest, storage
from farm.cli import build_parser
from farm.errors import ClusterError
from tests.farm import fakes
from tests.farm.helpers import events, local_cluster, output_files, state, temp_files, write_manifest
from worker import fake

GPUS = 2


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # Ray's accelerator type is the custom resource `accelerator_type:<T>` that GPU nodes carry.
    with local_cluster(num_gpus=GPUS, num_cpus=2 * GPUS, resources={"accelerator_type:H200": 1}):
        yield


def _submit(path: Path, factory=fake.factory, **options) -> driver.RunReport:
    return driver.submit(manifest.load(path), driver.SubmitOptions(factory=factory, progress=False, **options))


def _scripted(tmp_path: Path, **kwargs):
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return functools.partial(fakes.scripted, markers=str(markers), **kwargs)


def _started(root: Path) -> list[dict]:
    return [e for e in events(root) if e["event"] == "job_started"]


def test_every_job_is_published_once_with_its_sidecar(tmp_path):
    jobs = [{"id": "clip", "prompt": "a red circle moving left"},
            {"id": "still", "task": "t2i", "prompt": "a blue square", "size": [48, 32]},
            {"id": "sweep", "prompt": "a green triangle", "seeds": [1, 2, 3]}]
    report = _submit(write_manifest(tmp_path, jobs))
    root = tmp_path / "out"

    assert report.ok and report.counts == {"done": 5, "failed": 0, "pending": 0, "skipped": 0}
    media = ["test/clip_s0.mp4", "test/still_s0.png", "test/sweep_s1.mp4", "test/sweep_s2.mp4", "test/sweep_s3.mp4"]
    assert output_files(root) == sorted(media + [m + ".json" for m in media])
    sidecar = json.loads((root / "test/sweep_s2.mp4.json").read_text())
    assert sidecar["key"] == "sweep@2" and sidecar["seed"] == 2 and sidecar["attempt"] == 1
    assert sidecar["worker"]["gpu"] and sidecar["worker"]["node"]
    assert {s["state"] for s in state(root)["jobs"].values()} == {"done"}


def test_jobs_start_by_priority_then_manifest_order(tmp_path):
    jobs = [{"id": "low", "prompt": "x"}, {"id": "high", "prompt": "x", "priority": 10},
            {"id": "mid-a", "prompt": "x", "priority": 5}, {"id": "mid-b", "prompt": "x", "priority": 5}]
    _submit(write_manifest(tmp_path, jobs), workers=1)
    assert [e["key"] for e in _started(tmp_path / "out")] == ["high", "mid-a", "mid-b", "low"]


def test_worker_killed_mid_job_is_retried_on_another_worker(tmp_path):
    jobs = [{"id": f"ok{i}", "prompt": "fine"} for i in range(3)] + [{"id": "victim", "prompt": "crash-once"}]
    report = _submit(write_manifest(tmp_path, jobs), factory=_scripted(tmp_path))
    root = tmp_path / "out"

    assert report.ok and report.outcomes["victim"].attempts == 2
    first, second = [e for e in _started(root) if e["key"] == "victim"]
    assert first["slot"] != second["slot"]
    assert "worker_lost" in {e["event"] for e in events(root)}
    assert len(output_files(root)) == 2 * len(jobs) and not temp_files(root)


def test_a_worker_renders_its_next_job_while_it_publishes_the_last(tmp_path):
    """One worker: seed 0's publish holds until seed 1's render begins, which only a worker free during a publish
    can do; the GPU then never waits for an encode."""
    markers = tmp_path / "markers"
    markers.mkdir()
    factory = functools.partial(fakes.publish_beside_render, markers=str(markers))
    report = _submit(write_manifest(tmp_path, [{"id": "clip", "prompt": "x", "seeds": [0, 1]}]), factory=factory,
                     workers=1)
    root = tmp_path / "out"

    assert report.ok and (markers / "overlapped").exists()
    order = [(e["event"], e["key"]) for e in events(root) if e["event"] in ("job_started", "job_rendered", "job_done")]
    assert order.index(("job_rendered", "clip@0")) < order.index(("job_started", "clip@1")) \
        < order.index(("job_done", "clip@0"))
    sidecar = json.loads((root / "test/clip_s0.mp4.json").read_text())
    assert sidecar["gpu_seconds"] is None  # a CPU worker's (its render and publish timings are kept)
    # a clip's encode began at its decode, in the render: it overlaps the render and the publish alike
    assert sidecar["timings"]["publish"] > 0 and sidecar["timings"]["media_encode"] > 0


def test_a_worker_lost_while_it_publishes_one_job_and_renders_another_loses_neither(tmp_path):
    """Seed 1's render kills the worker while seed 0 publishes: the render takes the blame (its attempt counts, it
    retries), the publish goes back to pending with its attempt given back; both end done."""
    markers = tmp_path / "markers"
    markers.mkdir()
    factory = functools.partial(fakes.publish_beside_render, markers=str(markers), hold="crash")
    report = _submit(write_manifest(tmp_path, [{"id": "clip", "prompt": "x", "seeds": [0, 1]}]), factory=factory,
                     workers=1)
    root = tmp_path / "out"

    assert report.ok and not temp_files(root)
    requeued = [e for e in events(root) if e["event"] == "job_requeued"]
    retried = [e for e in events(root) if e["event"] == "job_retry"]
    assert [e["key"] for e in requeued] == ["clip@0"] and [e["key"] for e in retried] == ["clip@1"]
    assert requeued[0]["error"].startswith("its worker was stopped") and "worker lost" in retried[0]["error"]
    attempts = {seed: json.loads((root / f"test/clip_s{seed}.mp4.json").read_text())["attempt"] for seed in (0, 1)}
    assert attempts == {0: 1, 1: 2}


def test_a_publish_past_its_timeout_takes_the_render_beside_it_back_to_the_queue(tmp_path):
    """Seed 0's publish and seed 1's render both hang on one worker; seed 0's timeout kills the worker: seed 0
    retries (attempt 2), seed 1 is requeued with its attempt given back, and both end done."""
    markers = tmp_path / "markers"
    markers.mkdir()
    factory = functools.partial(fakes.publish_beside_render, markers=str(markers), hold="hang")
    jobs = [{"id": "clip", "prompt": "x", "seeds": [0, 1], "timeout": 10}]
    report = _submit(write_manifest(tmp_path, jobs), factory=factory, workers=1)
    root = tmp_path / "out"

    assert report.ok and not temp_files(root)
    logged = events(root)
    assert [e["key"] for e in logged if e["event"] == "job_timeout"] == ["clip@0"]
    requeued = [e for e in logged if e["event"] == "job_requeued"]
    assert [e["key"] for e in requeued] == ["clip@1"] and "clip@0 timed out" in requeued[0]["error"]
    attempts = {seed: json.loads((root / f"test/clip_s{seed}.mp4.json").read_text())["attempt"] for seed in (0, 1)}
    assert attempts == {0: 2, 1: 1}


def test_with_max_workers_an_idle_worker_stops_once_the_queue_is_empty_and_a_job_coming_back_gets_one(tmp_path):
    """`--max-workers`: `quick` done and nothing pending, its worker is released; then `held`'s worker dies
    (killed here, its gate still shut), so `held` comes back to the queue and a worker is started for it."""
    gate = tmp_path / "gate"
    jobs = [{"id": "held", "prompt": f"wait-for {gate}"}, {"id": "quick", "prompt": "fine"}]
    root = tmp_path / "out"

    released = threading.Event()

    def kill_held_worker_once_the_other_is_released() -> None:
        deadline = time.monotonic() + 120
        try:
            while not any(e["event"] == "worker_released" for e in _events_so_far(root)):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
            released.set()
            logged = _events_so_far(root)
            slot = next(e["slot"] for e in logged if e["event"] == "job_started" and e["key"] == "held")
            os.kill(next(e["pid"] for e in logged if e["event"] == "worker_ready" and e["slot"] == slot),
                    signal.SIGKILL)
        finally:
            gate.touch()  # for the next attempt (the killed worker never sees it), or to end a run gone wrong

    killer = threading.Thread(target=kill_held_worker_once_the_other_is_released)
    killer.start()
    try:
        report = _submit(write_manifest(tmp_path, jobs), factory=_scripted(tmp_path), max_workers=GPUS + 1)
    finally:
        killer.join()

    assert released.is_set(), "no worker was released once the queue was empty"
    assert report.ok and report.outcomes["held"].attempts == 2 and report.outcomes["quick"].attempts == 1
    logged = [(e["event"], e.get("slot")) for e in events(root)]
    released = next(slot for event, slot in logged if event == "worker_released")
    assert logged.index(("worker_released", released)) < logged.index(("worker_added", released))
    pools = [(e["wanted"], e["ready"]) for e in events(root) if e["event"] == "workers"]
    assert pools[0] == (2, 0) and (2, 2) in pools and (1, 1) in pools  # min(2 jobs, max_workers), then one released


def _events_so_far(root: Path) -> list[dict]:
    """The events written whole so far (the driver may be writing the last line)."""
    path = root / ".farm/test/events.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line) for line in lines]


def test_always_failing_job_ends_failed_with_its_error_and_the_exit_code_is_not_zero(tmp_path, capsys):
    jobs = [{"id": "good", "prompt": "fine"}, {"id": "bad", "prompt": "fail"}, {"id": "also-good", "prompt": "ok"}]
    args = build_parser().parse_args(["submit", str(write_manifest(tmp_path, jobs)), "--no-progress"])
    args.pipeline = _scripted(tmp_path)

    assert args.func(args) == 1
    record = state(tmp_path / "out")["jobs"]
    # retries: 2, but it failed on both workers: the job's own fault, retried no more
    assert record["bad"]["state"] == "failed" and record["bad"]["attempts"] == 2
    assert "RuntimeError: scripted failure" in record["bad"]["error"]
    assert record["good"]["state"] == record["also-good"]["state"] == "done"
    err = capsys.readouterr().err
    assert "bad (failed, 2 attempts): RuntimeError: scripted failure of seed 0 (failed on 2 different workers: " \
           "the job's own fault)" in err


def test_a_job_past_its_timeout_has_its_worker_killed_and_is_requeued(tmp_path):
    jobs = [{"id": "stuck", "prompt": "hang-once", "timeout": 10}, {"id": "next", "prompt": "fine"}]
    report = _submit(write_manifest(tmp_path, jobs), factory=_scripted(tmp_path))

    assert report.ok and report.outcomes["stuck"].attempts == 2
    assert [e["key"] for e in events(tmp_path / "out") if e["event"] == "job_timeout"] == ["stuck"]
    assert not temp_files(tmp_path / "out")


def test_jobs_past_their_timeout_do_not_retire_the_last_worker(tmp_path):
    """A job's timeout is its own: three of them kill and restart the only worker, and the job beside them renders."""
    jobs = [{"id": f"stuck{i}", "prompt": "hang", "timeout": 10, "retries": 0, "priority": 10} for i in range(3)]
    report = _submit(write_manifest(tmp_path, [*jobs, {"id": "good", "prompt": "fine"}]), factory=_scripted(tmp_path),
                     workers=1)
    kinds = [e["event"] for e in events(tmp_path / "out")]

    assert report.counts == {"done": 1, "failed": 3, "pending": 0, "skipped": 0}
    assert kinds.count("job_timeout") == 3 and "worker_retired" not in kinds


def test_a_worker_failing_three_jobs_that_render_elsewhere_is_retired(tmp_path):
    """Logical GPU 0 fails every render: the jobs it failed render on GPU 1, so GPU 0 is to blame and retires."""
    jobs = [{"id": f"job{i}", "prompt": "fail-on-gpu-0"} for i in range(8)]
    report = _submit(write_manifest(tmp_path, jobs), factory=_scripted(tmp_path))
    root = tmp_path / "out"

    assert report.ok and report.counts["done"] == 8
    retired = [e for e in events(root) if e["event"] == "worker_retired"]
    assert [e["slot"] for e in retired] == [0] and "failed 3 different jobs in a row that rendered on other workers; " \
        "last: RuntimeError: scripted failure" in retired[0]["reason"]
    assert {json.loads((root / f"test/job{i}_s0.mp4.json").read_text())["worker"]["gpu"][0] for i in range(8)} == {"1"}


# Issue 49: jobs that fail for their own reasons, beside good jobs; the workers are not to blame, and the good jobs
# render. A job's own: out of memory for its size (on any number of workers), or failing on two different workers.
BAD_JOBS = [
    pytest.param("out-of-memory", 1, 3, "JobFault: MemoryError: Unable to allocate 7.28 TiB", id="oom-one-worker"),
    pytest.param("out-of-memory", GPUS, 2, "JobFault: MemoryError: Unable to allocate 7.28 TiB", id="oom-two-workers"),
    pytest.param("fail", GPUS, 2, "(failed on 2 different workers: the job's own fault)", id="fails-on-two-workers"),
    pytest.param("fail", 1, 3, "RuntimeError: scripted failure", id="fails-on-the-last-worker"),
]


@pytest.mark.parametrize("prompt,workers,attempts,error", BAD_JOBS)
def test_three_bad_jobs_fail_and_the_good_jobs_beside_them_render(tmp_path, prompt, workers, attempts, error):
    jobs = [{"id": f"bad{i}", "prompt": prompt, "priority": 10} for i in range(3)]
    jobs += [{"id": f"good{i}", "prompt": "fine"} for i in range(2)]
    report = _submit(write_manifest(tmp_path, jobs), factory=_scripted(tmp_path), workers=workers)
    kinds = [e["event"] for e in events(tmp_path / "out")]

    assert report.counts == {"done": 2, "failed": 3, "pending": 0, "skipped": 0}
    for i in range(3):
        outcome = report.outcomes[f"bad{i}"]
        assert outcome.attempts == attempts and error in outcome.error, outcome.error
    assert "worker_retired" not in kinds and "run_stalled" not in kinds


# A worker's start fails in __init__, or after ready() in the first job it takes (its VAE's background
# build): the scheduler treats both alike, and a job that found the failure is not charged for it.
BAD_GPU_ZERO = [
    pytest.param(fakes.bad_gpu_zero, "RuntimeError: CUDA error: uncorrectable ECC error", id="in-init"),
    pytest.param(fakes.vae_fails_on_gpu_zero, "WorkerStartError: ", id="vae-after-ready"),
]
NO_GPU_STARTS = [
    pytest.param(fakes.no_gpu_works, r"RuntimeError: CUDA error: no CUDA-capable device is detected", id="in-init"),
    pytest.param(fakes.no_vae_loads, r"WorkerStartError: \S+/ckpt/vae: the VAE did not build: CheckpointError: "
                 r"\S+/ckpt/vae/diffusion_pytorch_model.safetensors: does not match vae/config.json \(scripted\)",
                 id="vae-after-ready"),
]


@pytest.mark.parametrize("factory,cause", BAD_GPU_ZERO)
def test_a_gpu_that_cannot_load_the_model_does_not_stop_the_run(tmp_path, factory, cause):
    jobs = [{"id": f"job{i}", "prompt": "fine"} for i in range(4)]
    report = _submit(write_manifest(tmp_path, jobs), factory=factory)
    root = tmp_path / "out"

    assert report.ok and {outcome.attempts for outcome in report.outcomes.values()} == {1}
    assert {e["attempt"] for e in _started(root)} == {1}  # a job the broken worker took is requeued, not retried
    failed = [e for e in events(root) if e["event"] == "worker_init_failed"]
    assert failed and all(cause in e["error"] for e in failed)
    assert {json.loads((root / f"test/job{i}_s0.mp4.json").read_text())["worker"]["gpu"][0] for i in range(4)} == {"1"}


@pytest.mark.parametrize("factory,cause", NO_GPU_STARTS)
def test_when_no_worker_can_start_the_run_ends_once_the_init_failure_budget_is_spent(tmp_path, factory, cause):
    report = _submit(write_manifest(tmp_path, [{"id": "a", "prompt": "x"}]), factory=factory)
    root = tmp_path / "out"
    kinds = [e["event"] for e in events(root)]

    # The cause, not only its effect, is in the summary of every job it strands.
    outcome = report.outcomes["a"]
    assert outcome.error.startswith("no worker left to run it (all retired or failed to start); last: worker ")
    assert re.search(f" could not start: {cause}$", outcome.error), outcome.error
    # Not the job's fault: it stays pending with no attempt spent, however many workers it was given to.
    assert (outcome.state, outcome.attempts) == ("pending", 0)
    assert (state(root)["jobs"]["a"]["state"], state(root)["jobs"]["a"]["attempts"]) == ("pending", 0)
    assert {e["attempt"] for e in _started(root)} <= {1} and kinds.count("job_requeued") == len(_started(root))
    # Failures restart their slot until the budget (one per worker) is spent; after that each one retires its slot.
    assert kinds.count("worker_init_failed") == (GPUS - 1) + GPUS
    assert kinds.count("worker_retired") == GPUS


def test_a_sound_tokenizer_that_did_not_build_fails_the_jobs_with_sound_once_and_renders_the_silent_ones(tmp_path):
    jobs = [{"id": "clip", "prompt": "a"}, {"id": "silent", "prompt": "b", "sound": False},
            {"id": "still", "task": "t2i", "prompt": "c"}, {"id": "clip2", "prompt": "d"}]
    report = _submit(write_manifest(tmp_path, jobs, sound=True), factory=fakes.no_sound_tokenizer_loads)
    root = tmp_path / "out"

    assert not report.ok
    assert {key: (o.state, o.attempts) for key, o in report.outcomes.items()} == {
        "clip": ("failed", 1), "silent": ("done", 1), "still": ("done", 1), "clip2": ("failed", 1)}
    for key in ("clip", "clip2"):  # no worker could make the sound: refused at once, naming the folder
        assert re.match(r"SoundTokenizerLoadError: \S+/ckpt/sound_tokenizer: the sound tokenizer did not build",
                        report.outcomes[key].error), report.outcomes[key].error
    kinds = [e["event"] for e in events(root)]
    assert "worker_init_failed" not in kinds and "worker_retired" not in kinds and "job_requeued" not in kinds
    assert all(e["refused"] for e in events(root) if e["event"] == "job_failed")
    assert output_files(root) == ["test/silent_s0.mp4", "test/silent_s0.mp4.json", "test/still_s0.png",
                                  "test/still_s0.png.json"]


def test_temp_files_of_a_crashed_earlier_run_are_swept(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    leftover = storage.temp_path(tmp_path / "out/test/a_s0.mp4")
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half a video")

    assert _submit(path).ok
    assert output_files(tmp_path / "out") == ["test/a_s0.mp4", "test/a_s0.mp4.json"]


def test_one_worker_per_gpu_and_refusals_for_what_the_cluster_lacks():
    assert cluster_module.plan_workers(None, None, jobs=10) == cluster_module.WorkerPlan(GPUS, 1, 1, None)
    assert cluster_module.plan_workers(1, None, jobs=10).count == 1
    assert cluster_module.plan_workers(None, None, jobs=1).count == 1  # a worker without a job renders nothing
    with pytest.raises(ClusterError, match="more GPU workers than the cluster's 2 GPUs"):
        cluster_module.plan_workers(GPUS + 1, None, jobs=10)
    with pytest.raises(ClusterError, match="no B200 GPUs in the cluster"):
        cluster_module.plan_workers(None, "B200", jobs=10)


def test_cpu_workers_are_bounded_by_the_jobs_and_refused_beyond_the_cores(monkeypatch):
    # This module's cluster, seen GPU-less.
    monkeypatch.setattr(cluster_module, "_gpus", lambda accelerator_type, classes=(): 0)
    cores = int(cluster_module.ray.cluster_resources()["CPU"])
    assert cluster_module.plan_workers(None, None, jobs=3) == cluster_module.WorkerPlan(1, 0, cores, None)
    assert cluster_module.plan_workers(cores, None, jobs=2) == cluster_module.WorkerPlan(2, 0, cores // 2, None)
    for workers in (cores + 1, 100_000_000):
        with pytest.raises(ClusterError, match=f"more CPU workers than the cluster's {cores} CPUs"):
            cluster_module.plan_workers(workers, None, jobs=workers)


def test_accelerator_type_pins_workers_to_that_gpu_model(tmp_path):
    assert cluster_module.plan_workers(None, "H200", jobs=1).accelerator_type == "H200"
    assert _submit(write_manifest(tmp_path, [{"id": "a", "prompt": "x"}]), accelerator_type="H200").ok
