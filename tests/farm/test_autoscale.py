"""Autoscaling from the queue: Ray's own autoscaler, on its fake multi-node provider, adds 8-GPU nodes for the
workers `farm submit --max-workers` asks for, and removes them once the run's queue has drained."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.farm.helpers import assert_every_job_done_once, events, write_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
GPUS_PER_NODE = 8
MAX_WORKERS = 12  # two nodes' worth: the autoscaler may start 4


def _samples(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _pool(root: Path) -> list[tuple[int, int]]:
    """The run's (wanted, ready) workers, event by event; none before its event log exists."""
    if not (root / ".farm" / "test" / "events.jsonl").exists():
        return []
    return [(e["wanted"], e["ready"]) for e in events(root) if e["event"] == "workers"]


def _wait_for(condition, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:g}s"
        time.sleep(0.2)


def test_the_cluster_grows_for_the_queue_and_shrinks_once_it_drains(nodes, tmp_path):
    nodes.start_autoscaling_head(gpus_per_node=GPUS_PER_NODE, max_nodes=4, idle_timeout_s=3)
    samples = nodes.watch_nodes()
    _wait_for(lambda: _samples(samples), "the first sample of the cluster's nodes")
    assert _samples(samples)[0]["nodes"] == 0

    # Every job waits at a gate the test opens once the run holds all the workers it wants: no job can end before,
    # so the pool reaches its size whatever the speed of the nodes' start against the jobs'.
    gate = tmp_path / "gate"
    jobs = [{"id": f"shot{i:02d}", "prompt": f"shot {i} wait-for {gate}"} for i in range(30)]
    path = write_manifest(tmp_path, jobs, defaults={"steps": 100})
    root = tmp_path / "out"
    log = tmp_path / "submit.log"  # a file, not a pipe nobody reads while the test waits
    with open(log, "w") as out:
        submit = subprocess.Popen([sys.executable, "-m", "farm", "submit", str(path), "--address", nodes.address,
                                   "--max-workers", str(MAX_WORKERS), "--pipeline", "tests.farm.fakes:gated",
                                   "--no-progress", "--start-timeout", "300"], cwd=REPO, env=nodes.env,
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_for(lambda: (MAX_WORKERS, MAX_WORKERS) in _pool(root), "every wanted worker ready at once", 300)
        gate.touch()
        submit.wait(timeout=600)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait()
    assert submit.returncode == 0, log.read_text()[-4000:]

    # Every job once, on the nodes the autoscaler started for the run.
    assert_every_job_done_once(root, jobs)
    run_events = events(root)
    assert [e["attempt"] for e in run_events if e["event"] == "job_done"] == [1] * len(jobs)
    # The run asked for MAX_WORKERS (fewer than its jobs), never more, and let them go at the end.
    pool = _pool(root)
    assert pool[0] == (MAX_WORKERS, 0)
    assert max(wanted for wanted, _ in pool) == MAX_WORKERS
    assert sum(e["event"] == "worker_released" for e in run_events) >= 1

    # Two 8-GPU nodes hold 12 workers, and no more were started; after the queue drained they went away.
    _wait_for(lambda: _samples(samples)[-1]["nodes"] == 0, "the idle nodes' removal")
    counts = [s["nodes"] for s in _samples(samples)]
    assert max(counts) == -(-MAX_WORKERS // GPUS_PER_NODE)
    assert counts[0] == counts[-1] == 0
