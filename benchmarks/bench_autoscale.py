"""A farm run on a cluster that autoscales from its queue: nodes, workers and jobs over time.

Ray's autoscaler on its fake multi-node provider (every node a raylet on this machine) starts with no GPU node
and a node type of 8 logical GPUs (at most 4 nodes, idle timeout `--idle-timeout`). `farm submit --max-workers N`
renders a manifest of fake jobs; a watcher samples the cluster's GPU nodes while the run's events log gives the
workers it wants and has and the jobs done. Prints one table row per change, then what the run left: every job
done once, the most nodes seen, the time until the last node was gone.

    python -m benchmarks.bench_autoscale --jobs 96 --max-workers 32 --seconds 3
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from testbed.farm_inputs import make_checkpoint
from testbed.ray_nodes import RayNodes

REPO = Path(__file__).resolve().parents[1]

GPUS_PER_NODE = 8
MAX_NODES = 4
SECONDS_PER_STEP = 0.01  # worker.fake's: a job's length is its steps


def _manifest(folder: Path, jobs: int, seconds: float) -> Path:
    make_checkpoint(folder / "ckpt")
    doc = {"version": 1, "name": "autoscale", "model": {"checkpoint": "ckpt"}, "output": {"root": "out"},
           "defaults": {"size": [32, 32], "frames": 5, "fps": 8, "steps": round(seconds / SECONDS_PER_STEP)},
           "jobs": [{"id": f"shot{i:03d}", "prompt": f"shot {i}"} for i in range(jobs)]}
    path = folder / "autoscale.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _timeline(samples: list[dict], run_events: list[dict], start: float, step: float) -> list[tuple]:
    """(seconds since submit, GPU nodes, workers wanted, workers ready, jobs done): the state every `step` seconds
    until the last node sample, and at that sample."""
    pools = [(e["ts"], (e["wanted"], e["ready"])) for e in run_events if e["event"] == "workers"]
    done = sorted(e["ts"] for e in run_events if e["event"] == "job_done")
    end = samples[-1]["t"]

    def at(t: float) -> tuple:
        nodes = [s["nodes"] for s in samples if s["t"] <= t]
        pool = [p for ts, p in pools if ts <= t]
        return (t - start, nodes[-1] if nodes else 0, *(pool[-1] if pool else (0, 0)), bisect.bisect_right(done, t))

    times = [start + i * step for i in range(int((end - start) // step) + 1)]
    return [at(t) for t in [*times, end]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=96)
    parser.add_argument("--max-workers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0, help="render time per job")
    parser.add_argument("--idle-timeout", type=float, default=5.0, help="seconds an idle node lives")
    parser.add_argument("--step", type=float, default=2.0, help="seconds between rows of the table")
    args = parser.parse_args()

    nodes = RayNodes()
    try:
        nodes.start_autoscaling_head(gpus_per_node=GPUS_PER_NODE, max_nodes=MAX_NODES,
                                     idle_timeout_s=args.idle_timeout)
        samples_path = nodes.watch_nodes()
        with tempfile.TemporaryDirectory() as folder:
            path = _manifest(Path(folder), args.jobs, args.seconds)
            start = time.time()
            run = subprocess.run([sys.executable, "-m", "farm", "submit", str(path), "--address", nodes.address,
                                  "--max-workers", str(args.max_workers), "--pipeline", "worker.fake:factory",
                                  "--no-progress", "--start-timeout", "600"],
                                 cwd=REPO, env=nodes.env, capture_output=True, text=True)
            finished = time.time()
            if run.returncode:
                sys.exit(f"farm submit failed:\n{run.stderr[-3000:]}")
            root = Path(folder) / "out"
            events_path = root / ".farm/autoscale/events.jsonl"
            run_events = [json.loads(line) for line in events_path.read_text().splitlines()]
            deadline = time.monotonic() + 300
            while json.loads(samples_path.read_text().splitlines()[-1])["nodes"]:
                if time.monotonic() > deadline:
                    sys.exit("the idle nodes were not removed within 300 s")
                time.sleep(0.5)
            samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
            done = [e for e in run_events if e["event"] == "job_done"]
            outputs = sorted(p.name for p in root.glob("autoscale/*.mp4"))
    finally:
        nodes.stop()

    print(f"{platform.node()}: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{args.jobs} jobs of {args.seconds:g} s, --max-workers {args.max_workers}, node type {GPUS_PER_NODE} "
          f"logical GPUs (max {MAX_NODES} nodes), idle timeout {args.idle_timeout:g} s\n")
    print("| t (s) | GPU nodes | workers wanted | workers ready | jobs done |")
    print("|---|---|---|---|---|")
    for t, node_count, wanted, ready, jobs_done in _timeline(samples, run_events, start, args.step):
        print(f"| {t:.1f} | {node_count} | {wanted} | {ready} | {jobs_done} |")
    once = len(done) == len({e["key"] for e in done}) == args.jobs == len(outputs)
    print(f"\njobs done: {len(done)} ({len(outputs)} outputs; each job once: {once}; "
          f"first attempts: {sum(e['attempt'] == 1 for e in done)})")
    print(f"most GPU nodes: {max(s['nodes'] for s in samples)} (asked for {min(args.jobs, args.max_workers)} "
          f"workers: {-(-min(args.jobs, args.max_workers) // GPUS_PER_NODE)} nodes)")
    print(f"run: {finished - start:.1f} s; last node gone {samples[-1]['t'] - finished:.1f} s after the run ended")


if __name__ == "__main__":
    main()
