"""The farm's scheduling cost alone: a fake pipeline sleeps instead of rendering, on N logical GPUs.

Side by side mode: for each job duration it runs the same jobs twice, side by side on one cluster:
- `farm`: `farm.driver.submit` with the fake pipeline (real RenderWorkers, publish, sidecars, verification);
- `bare ray`: the same number of actors that only sleep, fed by a minimal one-in-flight `ray.wait` loop.

Columns (milliseconds unless marked):
- dispatch overhead: per job, driver dispatch -> driver has the verified result, minus the worker's own
  time (render + publish); Ray's transport plus the driver's bookkeeping;
- publish: per job, the worker writing the PNG and its sidecar (farm only);
- idle gap: per worker, from the end of one job in the worker to the start of its next one: time a GPU waits.

    python -m benchmarks.bench_scheduler --gpus 8 --jobs 64 --seconds 0.25 1.0

Scale mode (`--scale`): one manifest of each size in turn (e.g. 1,000, 3,000 and 10,000 jobs) on a
`ray.cluster_utils.Cluster` of `--nodes` nodes with `--gpus` logical GPUs each, one real RenderWorker actor per GPU,
jobs as long as a studio's mix scaled down by SPEEDUP (stills and clips, log-normal), so that how the driver's
costs grow with the queue shows in one run. Per size: the dispatch overhead per job (as above), the driver's CPU
time per job and peak RSS, the sizes of the events log and state file, the time of `farm status` (a separate
process, as a user runs it) taken every few seconds during the run and once after it, and what a resubmit of the
finished manifest costs (every output checked, its folder swept for temp files: in one call, as a run's start
does, and a call per job, as it did before, on a sample). Last, bare Ray's dispatch overhead
for the smallest size's durations on as many sleeping actors, for scale.

    python -m benchmarks.bench_scheduler --scale 1000 3000 10000 --nodes 4 --gpus 8
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray
import structlog
import yaml

from farm import driver, manifest, storage
from worker import fake

STEPS = 10
REPO = Path(__file__).resolve().parents[1]
# A studio's mix, in seconds on the GPU: (share, median, log-normal sigma) of stills and of clips.
MIX = [(0.7, 12.0, 0.3), (0.3, 90.0, 0.4)]
SPEEDUP = 100  # render times divided by this, so 10,000 jobs on 32 GPUs take minutes
SECONDS_PER_STEP = 0.01  # the fake's sleep per step: a job's duration is its step count
STATUS_EVERY = 5.0  # seconds between `farm status` runs during a scale run
SWEEP_SAMPLE = 200  # jobs whose one-call-per-job temp sweep is timed


class Sleeper:
    """The bare-Ray baseline's worker: sleeps and reports when, nothing else."""

    def run(self, seconds: float) -> tuple[float, float]:
        start = time.time()
        time.sleep(seconds)
        return start, time.time()


def _machine() -> str:
    return (f"machine: {platform.node()} | {platform.processor() or platform.machine()} | "
            f"{os.cpu_count()} CPU cores | Python {platform.python_version()} | Ray {ray.__version__}")


# The fake pipeline reads only the checkpoint's configs (its request rules), never the weights.
TOY = Path(__file__).resolve().parents[1] / "checkpoints" / "toy" / "bf16"


def _write_manifest(folder: Path, jobs: int, seconds: float) -> Path:
    doc = {"version": 1, "name": "bench", "model": {"checkpoint": str(TOY)}, "output": {"root": "out"},
           "defaults": {"task": "t2i", "size": [16, 16], "steps": STEPS},
           "jobs": [{"id": f"job{i}", "prompt": "bench", "seed": i} for i in range(jobs)]}
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _farm(jobs: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        m = manifest.load(_write_manifest(Path(folder), jobs, seconds))
        factory = functools.partial(fake.factory, seconds_per_step=seconds / STEPS)
        report = driver.submit(m, driver.SubmitOptions(factory=factory, progress=False))
        assert report.ok, report.outcomes
        runs = _runs(m)
        sidecars = {job.key: json.loads(storage.sidecar_path(job.media).read_text()) for job in m.jobs}
    publish = [s["timings"]["publish"] for s in sidecars.values()]
    return _stats(runs, publish)


def _runs(m: manifest.Manifest) -> list[tuple]:
    """(driver dispatch, driver result, worker start, worker end, slot) of each job's successful attempt."""
    log = [json.loads(line) for line in storage.events_path(m.output_root, m.name).read_text().splitlines()]
    started = {(e["key"], e["attempt"]): e for e in log if e["event"] == "job_started"}
    done = [e for e in log if e["event"] == "job_done"]
    return [(started[e["key"], e["attempt"]]["ts"], e["ts"], e["worker_started"], e["worker_finished"], e["slot"])
            for e in done]


def _bare_ray(gpus: int, durations: list[float]) -> dict:
    actors = [ray.remote(Sleeper).options(num_gpus=1).remote() for _ in range(gpus)]
    ray.get([a.run.remote(0) for a in actors])  # started, like the farm's workers after ready()
    queue, idle, inflight, runs = list(durations), list(range(gpus)), {}, []
    while queue or inflight:
        while idle and queue:
            seconds = queue.pop(0)
            slot = idle.pop()
            inflight[actors[slot].run.remote(seconds)] = (slot, time.time())
        [ref], _ = ray.wait(list(inflight), num_returns=1)
        slot, dispatched = inflight.pop(ref)
        start, end = ray.get(ref)
        runs.append((dispatched, time.time(), start, end, slot))
        idle.append(slot)
    for actor in actors:
        ray.kill(actor)
    return _stats(runs, publish=[])


def _stats(runs: list[tuple], publish: list[float]) -> dict:
    """runs: (driver dispatch, driver result, worker start, worker end, slot) per job, wall-clock seconds."""
    overhead = [(result - sent) - (end - start) for sent, result, start, end, _ in runs]
    gaps = []
    for slot in {r[4] for r in runs}:
        mine = sorted((start, end) for _, _, start, end, s in runs if s == slot)
        gaps += [nxt[0] - prev[1] for prev, nxt in zip(mine, mine[1:], strict=False)]
    return {"overhead": overhead, "publish": publish, "gaps": gaps}


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.1f}"


def _row(name: str, seconds: float, s: dict) -> str:
    return (f"| {name} | {seconds * 1000:.0f} | {_ms(s['overhead'], 0.5)} | {_ms(s['overhead'], 0.9)} | "
            f"{_ms(s['publish'], 0.5)} | {_ms(s['gaps'], 0.5)} | {_ms(s['gaps'], 0.9)} | {_ms(s['gaps'], 1.0)} |")


def _ratio(farm: dict, bare: dict, key: str) -> str:
    return f"{statistics.median(farm[key]) / max(statistics.median(bare[key]), 1e-6):.1f}x"


# -- scale mode ----------------------------------------------------------------------------------------------


def _studio_steps(jobs: int) -> list[int]:
    """Step counts whose fake durations follow MIX / SPEEDUP (seeded: every run draws the same jobs)."""
    draw = random.Random(0)
    steps = []
    for _ in range(jobs):
        _, median, sigma = draw.choices(MIX, weights=[weight for weight, _, _ in MIX])[0]
        seconds = draw.lognormvariate(0.0, sigma) * median / SPEEDUP
        steps.append(max(1, round(seconds / SECONDS_PER_STEP)))
    return steps


def _write_scale_manifest(folder: Path, jobs: int) -> Path:
    doc = {"version": 1, "name": "scale", "model": {"checkpoint": str(TOY)}, "output": {"root": str(folder / "out")},
           "defaults": {"task": "t2i", "size": [16, 16]},
           "jobs": [{"id": f"job{i}", "prompt": "bench", "seed": i, "steps": n}
                    for i, n in enumerate(_studio_steps(jobs))]}
    path = folder / "scale.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _rss_mb() -> float:
    """This process's resident memory (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Watcher(threading.Thread):
    """Samples the driver's RSS every 0.2 s and times `farm status` on the run's root every STATUS_EVERY s."""

    def __init__(self, root: str):
        super().__init__(daemon=True)
        self.root, self.stop = root, threading.Event()
        self.rss: list[float] = []
        self.status: list[float] = []

    def run(self) -> None:
        next_status = time.monotonic() + STATUS_EVERY
        while not self.stop.wait(0.2):
            self.rss.append(_rss_mb())
            if time.monotonic() >= next_status and Path(self.root, storage.RECORDS_DIR).is_dir():
                self.status.append(_time_status(self.root))
                next_status = time.monotonic() + STATUS_EVERY


def _time_status(root: str) -> float:
    """Seconds of `farm status ROOT` as a user runs it: a new process."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # this checkout first
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "farm", "status", root, "--output", "json"], cwd=REPO,
                   env={**os.environ, "PYTHONPATH": path}, capture_output=True, check=True)
    return time.perf_counter() - started


def _scale_run(jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        loaded = time.perf_counter()
        m = manifest.load(_write_scale_manifest(Path(folder), jobs))
        loaded = time.perf_counter() - loaded
        watcher = _Watcher(m.output_root)
        factory = functools.partial(fake.factory, seconds_per_step=SECONDS_PER_STEP)
        load, cpu, wall = os.getloadavg()[0], time.process_time(), time.perf_counter()
        watcher.start()
        try:
            report = driver.submit(m, driver.SubmitOptions(factory=factory, progress=False))
        finally:
            watcher.stop.set()
            watcher.join()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert report.ok, report.counts
        records = storage.records_dir(m.output_root, m.name)
        runs = _runs(m)
        overhead = [(result - sent) - (end - start) for sent, result, start, end, _ in runs]
        # What a resubmit costs before it renders anything: every output checked, every folder swept for temps.
        resubmit = time.perf_counter()
        again = driver.submit(m, driver.SubmitOptions(factory=factory, progress=False))
        resubmit = time.perf_counter() - resubmit
        assert again.ok and len(again.skipped) == jobs, again.counts
        status_done = _time_status(m.output_root)  # every sidecar there to read
        sweep = time.perf_counter()
        storage.discard_temps(*m.jobs)
        sweep = time.perf_counter() - sweep
        # A call per job lists the full folder once per job (quadratic): timed on a sample, scaled to all jobs.
        sample = m.jobs[:SWEEP_SAMPLE]
        per_job = time.perf_counter()
        for job in sample:
            storage.discard_temps(job)
        per_job = (time.perf_counter() - per_job) / len(sample) * jobs
        return {"jobs": jobs, "wall": wall, "load": load, "manifest_load": loaded, "overhead": overhead,
                "resubmit": resubmit, "sweep": sweep, "sweep_per_job": per_job, "status_done": status_done,
                "cpu_per_job": cpu / jobs, "rss_peak": max(watcher.rss), "status": watcher.status,
                "events_mb": (records / "events.jsonl").stat().st_size / 2**20,
                "state_mb": (records / "state.json").stat().st_size / 2**20}


def _scale_row(r: dict) -> str:
    status = f"{statistics.median(r['status']):.2f} / {max(r['status']):.2f}" if r["status"] else "-"
    return (f"| {r['jobs']} | {r['wall']:.0f} | {r['jobs'] / r['wall']:.0f} | {_ms(r['overhead'], 0.5)} | "
            f"{_ms(r['overhead'], 0.99)} | {1000 * r['cpu_per_job']:.2f} | {r['rss_peak']:.0f} | "
            f"{r['events_mb']:.1f} | {r['state_mb']:.2f} | {status} ({len(r['status'])}) | {r['status_done']:.2f} | "
            f"{r['manifest_load']:.1f} | "
            f"{r['resubmit']:.1f} | {r['sweep']:.2f} / {r['sweep_per_job']:.1f} | {r['load']:.1f} |")


def _growth_row(small: dict, large: dict) -> str:
    """Each figure of the largest run over the smallest's: per-job figures should stay ~1x, totals ~jobs ratio."""
    def ratio(a: float, b: float) -> str:
        return f"{a / max(b, 1e-9):.1f}x"

    status = ratio(max(large["status"]), max(small["status"])) if small["status"] and large["status"] else "-"
    return (f"| {large['jobs']} / {small['jobs']} | | | "
            f"{ratio(statistics.median(large['overhead']), statistics.median(small['overhead']))} | | "
            f"{ratio(large['cpu_per_job'], small['cpu_per_job'])} | {ratio(large['rss_peak'], small['rss_peak'])} | "
            f"{ratio(large['events_mb'], small['events_mb'])} | {ratio(large['state_mb'], small['state_mb'])} | "
            f"{status} (max) | {ratio(large['status_done'], small['status_done'])} | "
            f"{ratio(large['manifest_load'], small['manifest_load'])} | "
            f"{ratio(large['resubmit'], small['resubmit'])} | {ratio(large['sweep'], small['sweep'])} / "
            f"{ratio(large['sweep_per_job'], small['sweep_per_job'])} | |")


def scale(sizes: list[int], nodes: int, gpus: int) -> None:
    from ray.cluster_utils import Cluster

    # One process per node's raylet and GCS; the driver (this process) is only the farm's driver.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": gpus, "num_gpus": gpus})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=gpus, num_gpus=gpus)
    cluster.wait_for_nodes(timeout=120)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        print(_machine())
        print(f"{nodes} nodes x {gpus} logical GPUs = {nodes * gpus} RenderWorker actors; fake renders of "
              f"{' / '.join(f'{w:.0%} median {m:g} s' for w, m, _ in MIX)} / {SPEEDUP}; PNG 16x16 outputs; "
              f"`farm status` every {STATUS_EVERY:g} s\n")
        print("| jobs | wall (s) | jobs/s | dispatch overhead p50 (ms) | p99 | driver CPU per job (ms) "
              "| driver RSS peak (MB) | events.jsonl (MB) | state.json (MB) | farm status during the run p50 / max (s) "
              "(runs) | farm status, all done (s) | manifest load (s) | resubmit, all done (s) "
              "| temp sweep of all jobs, one call / a call per job (s) "
              "| load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        results = []
        for jobs in sizes:
            results.append(_scale_run(jobs))
            print(_scale_row(results[-1]), flush=True)
        if len(results) > 1:
            print(_growth_row(results[0], results[-1]))
        bare = _bare_ray(nodes * gpus, [steps * SECONDS_PER_STEP for steps in _studio_steps(sizes[0])])
        print(f"\nbare Ray, the same {sizes[0]} durations on {nodes * gpus} sleeping actors: dispatch overhead p50 "
              f"{_ms(bare['overhead'], 0.5)} ms, p99 {_ms(bare['overhead'], 0.99)} ms (load avg "
              f"{os.getloadavg()[0]:.1f})")
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8, help="logical GPUs (per node with --scale), one worker each")
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--seconds", type=float, nargs="+", default=[0.25, 1.0], help="render time per job")
    parser.add_argument("--scale", type=int, nargs="+", metavar="JOBS", help="scale mode: manifests of these sizes")
    parser.add_argument("--nodes", type=int, default=4, help="nodes of the scale mode's cluster")
    args = parser.parse_args()

    # The farm logs every event; here only the table matters.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    if args.scale:
        scale(args.scale, args.nodes, args.gpus)
        return
    ray.init(address="local", num_gpus=args.gpus, num_cpus=args.gpus, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    print(_machine())
    print(f"{args.gpus} logical GPUs, {args.jobs} jobs per row, {STEPS} fake steps per job, PNG 16x16 outputs\n")
    print("| scheduler | render (ms) | dispatch overhead p50 (ms) | p90 | publish p50 (ms) "
          "| idle gap p50 (ms) | p90 | max |")
    print("|---|---|---|---|---|---|---|---|")
    for seconds in args.seconds:
        farm, bare = _farm(args.jobs, seconds), _bare_ray(args.gpus, [seconds] * args.jobs)
        print(_row("farm", seconds, farm))
        print(_row("bare ray", seconds, bare))
        print(f"| farm / bare ray | | {_ratio(farm, bare, 'overhead')} | | | {_ratio(farm, bare, 'gaps')} | | |")
    ray.shutdown()


if __name__ == "__main__":
    main()
