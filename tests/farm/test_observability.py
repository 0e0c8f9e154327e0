"""What the Ray dashboard shows of a run: each attempt named `render:<job>` in the state API, and the farm's
metrics on the Prometheus port that every node exports (what the dashboard's Metrics view reads)."""

from __future__ import annotations

import functools
import time
import urllib.request
from pathlib import Path

import pytest
import ray
from ray.util.state import list_tasks

from cosmos3.rules.request import RequestRules
from farm import driver, manifest
from tests.farm import fakes
from tests.farm.helpers import local_cluster, render_and_publish, write_manifest
from tests.worker.test_gpu_telemetry import ScriptedDevice
from worker import fake
from worker.actor import RenderWorker

JOBS = [{"id": "clip", "prompt": "fine"}, {"id": "sweep", "prompt": "fine", "seeds": [1, 2]},
        {"id": "bad", "prompt": "fail", "retries": 1}]


# What the run must leave on the metrics port: counters and histogram counts, and the gauges at rest.
EXPECTED_METRICS = {
    "ray_farm_jobs_done_total": 3.0,
    "ray_farm_jobs_failed_total": 1.0,
    "ray_farm_jobs_retried_total": 1.0,  # bad: retries 1
    "ray_farm_jobs_pending": 0.0,  # every job ended done or failed
    "ray_farm_job_seconds_count": 3.0,  # one observation per job done
    "ray_farm_step_seconds_count": 12.0,  # 3 jobs x 4 fake steps
    "ray_farm_queue_depth": 0.0,
    "ray_farm_busy_workers": 0.0,
    "ray_farm_workers_wanted": 0.0,
    "ray_farm_workers_ready": 0.0,
}


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """One run of JOBS on a cluster with the dashboard, metrics reported every 0.5 s (Ray's default is 10 s);
    the run's report and its metrics, scraped at once: Ray drops a gauge ~20 s after its last update."""
    with local_cluster(num_gpus=2, num_cpus=4, include_dashboard=True,
                       _system_config={"metrics_report_interval_ms": 500}):
        folder = tmp_path_factory.mktemp("observed")
        (folder / "markers").mkdir()
        factory = functools.partial(fakes.scripted, markers=str(folder / "markers"))
        path = write_manifest(folder, JOBS, name="observed")
        report = driver.submit(manifest.load(path), driver.SubmitOptions(factory=factory, progress=False))
        metrics = _eventually(lambda: _scrape(EXPECTED_METRICS), EXPECTED_METRICS, seconds=15)
        yield report, metrics


def _eventually(read, want, seconds: float = 30.0):
    """read() once it equals want (task events and metrics reach Ray's stores a moment after the fact)."""
    deadline = time.monotonic() + seconds
    got = read()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.5)
        got = read()
    return got


def _scrape(names, tag: str = 'manifest="observed"') -> dict[str, float]:
    """The values of `names` tagged `tag` (this module's manifest) on the head node's metrics port (absent: left
    out)."""
    port = ray.nodes()[0]["MetricsExportPort"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in names and tag in line:
            values[name] = float(line.rsplit(" ", 1)[1])
    return values


def test_every_attempt_is_named_for_its_job(observed):
    report, _ = observed
    assert report.counts == {"done": 3, "failed": 1, "pending": 0, "skipped": 0}

    def names() -> dict[str, int]:
        counts: dict[str, int] = {}
        # This cluster's address: another Ray instance on the machine must not make the lookup ambiguous.
        tasks = list_tasks(address=ray.get_runtime_context().gcs_address, filters=[("type", "=", "ACTOR_TASK")],
                           limit=1000, raise_on_missing_output=False)
        for task in tasks:
            if task.name.startswith("render:"):
                counts[task.name] = counts.get(task.name, 0) + 1
        return counts

    # `bad` ran twice (retries: 1); the others once.
    want = {"render:clip": 1, "render:sweep@1": 1, "render:sweep@2": 1, "render:bad": 2}
    assert _eventually(names, want) == want


@pytest.mark.parametrize("metric", EXPECTED_METRICS)
def test_the_run_is_counted_on_the_metrics_port(observed, metric):
    _, metrics = observed
    assert metrics.get(metric) == EXPECTED_METRICS[metric]


def _renderer_on_a_capped_gpu(model, gpu: bool) -> fake.FakeRenderer:
    """A fake renderer that says it runs on a GPU; loading it (in the worker's process, before the worker opens
    NVML) plants NVML's readings of a capped GPU, which this machine has none of."""
    from worker import gpu_telemetry

    gpu_telemetry.open_device = lambda uuid: ScriptedDevice([(1605.0, 690.5, 0x4)])  # every read the same
    renderer = fake.FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step=0.01)
    renderer.device, renderer.facts = "cuda:0", {"gpu_uuid": "GPU-0f1e2d3c-aaaa-bbbb-cccc-123456789abc"}
    return renderer


def test_a_gpu_workers_clock_and_power_cap_share_reach_the_metrics_port(observed, tmp_path):
    """A GPU worker feeds each telemetry sample and each job's figures to its slot's gauges."""
    path = write_manifest(tmp_path, [{"id": "still", "task": "t2i", "prompt": "fine"}], name="gauges")
    m = manifest.load(path)
    Path(m.output_root).mkdir()
    worker = ray.remote(RenderWorker).options(num_gpus=1, max_restarts=0).remote(
        m.model, _renderer_on_a_capped_gpu, {"run": "r", "path": str(path), "sha256": "-", "name": "gauges",
                                             "root": m.output_root}, 7)
    render_and_publish(worker, m.jobs[0])
    want = {"ray_farm_worker_sm_clock_mhz": 1605.0, "ray_farm_worker_power_w": 690.5,
            "ray_farm_worker_power_capped_share": 1.0}
    try:
        assert _eventually(lambda: _scrape(want, 'slot="7"'), want, seconds=15) == want
    finally:
        ray.kill(worker)
