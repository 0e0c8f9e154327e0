"""The farm's scheduling cost alone: a fake pipeline sleeps a fixed time per job on N logical GPUs.

For each job duration it runs the same jobs twice, side by side on one cluster:
- `farm`: `farm.driver.submit` with the fake pipeline (real RenderWorkers, publish, sidecars, verification);
- `bare ray`: the same number of actors that only sleep, fed by a minimal one-in-flight `ray.wait` loop.

Columns (milliseconds unless marked):
- dispatch overhead: per job, driver dispatch -> driver has the verified result, minus the worker's own
  time (render + publish); Ray's transport plus the driver's bookkeeping;
- publish: per job, the worker writing the PNG and its sidecar (farm only);
- idle gap: per worker, from the end of one job in the worker to the start of its next one: time a GPU waits.

    python benchmarks/bench_scheduler.py --gpus 8 --jobs 64 --seconds 0.25 1.0
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import structlog
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from farm import driver, manifest, storage  # noqa: E402
from worker import fake  # noqa: E402

STEPS = 10


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
        log = [json.loads(line) for line in storage.events_path(m.output_root, m.name).read_text().splitlines()]
        sidecars = {job.key: json.loads(storage.sidecar_path(job.media).read_text()) for job in m.jobs}
    started = {e["key"]: e for e in log if e["event"] == "job_started"}
    done = [e for e in log if e["event"] == "job_done"]
    runs = [(started[e["key"]]["ts"], e["ts"], e["worker_started"], e["worker_finished"], e["slot"]) for e in done]
    publish = [s["timings"]["publish"] for s in sidecars.values()]
    return _stats(runs, publish)


def _bare_ray(gpus: int, jobs: int, seconds: float) -> dict:
    actors = [ray.remote(Sleeper).options(num_gpus=1).remote() for _ in range(gpus)]
    ray.get([a.run.remote(0) for a in actors])  # started, like the farm's workers after ready()
    queue, idle, inflight, runs = list(range(jobs)), list(range(gpus)), {}, []
    while queue or inflight:
        while idle and queue:
            queue.pop(0)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8, help="logical GPUs, one worker each")
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--seconds", type=float, nargs="+", default=[0.25, 1.0], help="render time per job")
    args = parser.parse_args()

    # The farm logs every event; here only the table matters.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    ray.init(address="local", num_gpus=args.gpus, num_cpus=args.gpus, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    print(_machine())
    print(f"{args.gpus} logical GPUs, {args.jobs} jobs per row, {STEPS} fake steps per job, PNG 16x16 outputs\n")
    print("| scheduler | render (ms) | dispatch overhead p50 (ms) | p90 | publish p50 (ms) "
          "| idle gap p50 (ms) | p90 | max |")
    print("|---|---|---|---|---|---|---|---|")
    for seconds in args.seconds:
        farm, bare = _farm(args.jobs, seconds), _bare_ray(args.gpus, args.jobs, seconds)
        print(_row("farm", seconds, farm))
        print(_row("bare ray", seconds, bare))
        print(f"| farm / bare ray | | {_ratio(farm, bare, 'overhead')} | | | {_ratio(farm, bare, 'gaps')} | | |")
    ray.shutdown()


if __name__ == "__main__":
    main()
