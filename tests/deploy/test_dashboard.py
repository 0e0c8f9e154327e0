"""Every query of docs/deploy/farm_grafana_dashboard.json returns, from a real Prometheus, the series a farm run
produced.

A Prometheus (the `prometheus` binary; Debian's package) scrapes a Ray cluster with the job of
docs/deploy/prometheus.yml, its target the cluster's metrics port, while the farm renders a small manifest of the
toy checkpoint on two CPU workers: three stills and one job whose output path is taken by a directory, so its
publish fails on both of its attempts (one retry). The toy renders on the CPU; each worker is told its GPU is one
whose NVML readings are scripted, so the GPU panels have series too; on a CUDA machine the `gpu` run renders on
up to two GPUs and their telemetry is NVML's (the sampler reads once as each job starts, so every worker that
rendered has a clock and power series). Then each panel's
query, with the dashboard's variables at "All" as Grafana sends them, is evaluated over the run as Grafana would
(a range query) until it returns the label sets the run's own records say it produced (the manifest; the worker
slots its events name), or a deadline passes. Prometheus and the Ray cluster are stopped also on failure.

The cluster is a local one the test starts (`ray.init(address="local")`, as tests/farm's do) and the driver joins,
rather than the one `farm submit` starts and ends with its run: the run's counters stay on the metrics port after
the run, so no scrape has to land before the cluster goes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import ray
import yaml

from farm import driver, manifest
from tests.worker.test_gpu_telemetry import ScriptedDevice
from worker.actor import cosmos3_factory

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"
TOY = REPO / "checkpoints" / "toy" / "bf16"
PROMETHEUS = shutil.which("prometheus")
NAME = "dashboard-run"
# Grafana's values for the dashboard's variables at "All" (each variable's allValue) and its rate window for a
# data source scraped every 15 s (its default): max(4 x 15 s, interval + 15 s).
VARIABLES = {"$SessionName": ".+", "$Cluster": ".*", "$manifest": ".+", "$__rate_interval": "1m"}
JOBS = [{"id": f"still-{i}", "prompt": "a red circle on a blue background"} for i in range(3)] + [
    {"id": "blocked", "prompt": "a green square on a white background", "retries": 1}]
DEADLINE = 120.0  # seconds for Prometheus to start, to scrape, and to hold every expected series

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="no `prometheus` binary: apt-get install prometheus (scripts/setup.sh does, where apt "
                               "is available)")


def toy_on_a_scripted_gpu(model, gpu: bool):
    """The real pipeline of the toy checkpoint, on the CPU, in a worker whose GPU telemetry reads a capped GPU:
    1,605 MHz at 690.5 W, the clock held down by the power cap. Runs in the worker's process."""
    from worker import gpu_telemetry

    gpu_telemetry.open_device = lambda uuid: ScriptedDevice([(1605.0, 690.5, 0x4)])
    renderer = cosmos3_factory(model, gpu)
    renderer.device, renderer.facts = "cuda:0", {"gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000"}
    return renderer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _until(read, done, what: str, alive=lambda: True):
    """read() once done(read()) holds; fails naming `what` and the last value after DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while True:
        assert alive(), f"{what}: Prometheus exited"
        try:
            value = read()
        except OSError as err:  # not listening yet
            value = err
        if not isinstance(value, OSError) and done(value):
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {DEADLINE:g} s; last: {value}"
        time.sleep(0.5)


class Prometheus:
    """A Prometheus running the `ray` job of docs/deploy/prometheus.yml, its target list a file of our own."""

    def __init__(self, folder: Path, metrics_port: int):
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        (job,) = config["scrape_configs"]
        targets = folder / "targets.json"
        # The format Ray writes its service discovery file in; the port is the cluster's metrics port.
        targets.write_text(json.dumps([{"labels": {}, "targets": [f"127.0.0.1:{metrics_port}"]}]))
        job["file_sd_configs"] = [{"files": [str(targets)]}]
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = open(folder / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.job = job["job_name"]

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.log.close()

    def api(self, path: str, **params: str) -> list:
        answer = _get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")
        assert answer["status"] == "success", answer
        return answer["data"]

    def series(self, expr: str, start: float, end: float) -> set[frozenset]:
        """The label sets of a range query over [start, end], as Grafana asks for a panel."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        return {frozenset(item["metric"].items()) for item in data["result"]}


def _queries(text: str) -> str:
    for name, value in VARIABLES.items():
        text = text.replace(name, value)
    return text


def _dashboard() -> dict:
    return json.loads((DEPLOY / "farm_grafana_dashboard.json").read_text())


def _targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, query with the variables substituted) of every panel."""
    return [(panel["title"], target["refId"], _queries(target["expr"]))
            for panel in _dashboard()["panels"] for target in panel["targets"]]


def _expected(expr: str, slots: set[str]) -> set[frozenset]:
    """What a panel's query must return for this run: one series per manifest (here one), or per manifest and
    worker slot for the workers' own gauges."""
    if "by (manifest, slot)" in expr:
        return {frozenset({"manifest": NAME, "slot": slot}.items()) for slot in slots}
    return {frozenset({"manifest": NAME}.items())}


# Where the toy renders: on the CPU with scripted GPU telemetry, or (`gpu`, on a CUDA machine) on real GPUs whose
# telemetry NVML reads.
FACTORIES = [pytest.param(toy_on_a_scripted_gpu, id="cpu-scripted-gpu"),
             pytest.param(cosmos3_factory, id="gpu", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module", params=FACTORIES)
def observed(tmp_path_factory, request):
    """A farm run scraped by Prometheus: (Prometheus, run start, the run's report, the slots that rendered)."""
    folder = tmp_path_factory.mktemp("dashboard")
    doc = {"version": 1, "name": NAME, "model": {"checkpoint": str(TOY)}, "output": {"root": str(folder / "out")},
           "defaults": {"task": "t2i", "size": [96, 96], "steps": 4}, "jobs": JOBS}
    path = folder / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    loaded = manifest.load(path)
    blocked = next(job for job in loaded.jobs if job.key == "blocked")
    Path(blocked.media).mkdir(parents=True)  # a directory where its PNG goes: the publish's rename fails
    with contextlib.ExitStack() as stack:
        # The cluster reports metrics every 0.5 s (Ray's default is 10 s) so a short run shows in them.
        ray.init(address="local", num_cpus=2, include_dashboard=True,
                 _system_config={"metrics_report_interval_ms": 500})
        stack.callback(ray.shutdown)
        prometheus = Prometheus(folder, ray.nodes()[0]["MetricsExportPort"])
        stack.callback(prometheus.stop)
        _until(lambda: prometheus.api("query", query=f'up{{job="{prometheus.job}"}} == 1')["result"], bool,
               "a first scrape of the cluster", prometheus.alive)
        start = time.time()
        report = driver.submit(loaded, driver.SubmitOptions(workers=2, factory=request.param, progress=False))
        events = [json.loads(line) for line in (folder / "out" / ".farm" / NAME / "events.jsonl").open()]
        slots = {str(e["slot"]) for e in events if e["event"] == "job_started"}
        yield prometheus, start, report, slots


def test_the_run_rendered_the_stills_and_failed_the_blocked_job(observed):
    _, _, report, slots = observed
    assert report.counts == {"done": 3, "failed": 1, "pending": 0, "skipped": 0}
    assert slots  # workers rendered: their gauges have series


@pytest.mark.parametrize("title, ref, expr", _targets(), ids=[f"{t}:{r}" for t, r, _ in _targets()])
def test_every_panel_query_returns_the_series_the_run_produced(observed, title, ref, expr):
    prometheus, start, _, slots = observed
    want = _expected(expr, slots)
    got = _until(lambda: prometheus.series(expr, start - 60, time.time()), lambda seen: seen == want,
                 f"{title} ({ref}): {expr} returning {sorted(map(sorted, want))}", prometheus.alive)
    assert got == want


def test_every_variable_offers_the_runs_values(observed):
    """The dashboard's variables (label_values queries) list this run's session, no cluster label off
    Kubernetes, and the manifest."""
    prometheus, start, _, _ = observed
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"] if v["type"] == "query"}
    assert set(variables) == {"SessionName", "Cluster", "manifest"}
    session = ray._private.worker.global_worker.node.session_name  # the SessionName tag Ray puts on every metric
    want = {"SessionName": [session], "Cluster": [], "manifest": [NAME]}
    for name, variable in variables.items():
        metric, label = _queries(variable["query"]["query"]).removeprefix("label_values(").removesuffix(")") \
            .rsplit(", ", 1)
        values = _until(lambda m=metric, la=label: prometheus.api(f"label/{la}/values", **{"match[]": m},
                                                                  start=f"{start - 60:.3f}", end=f"{time.time():.3f}"),
                        lambda seen, n=name: seen == want[n], f"variable {name}", prometheus.alive)
        assert values == want[name]
