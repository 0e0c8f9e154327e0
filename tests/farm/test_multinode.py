"""`farm submit --address` and `ray job submit` on a cluster of separate `ray start` processes (tests/farm/ray_nodes):
a worker node's raylet killed mid-run, a node added mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.farm.helpers import events, output_files, started_on, state, temp_files, write_manifest
from tests.farm.ray_nodes import RayNodes

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
FARM = [sys.executable, "-m", "farm", "submit"]
OPTIONS = ["--pipeline", "worker.fake:factory", "--no-progress", "--start-timeout", "120"]


@pytest.fixture
def nodes():
    """Each test starts its head and worker nodes; all are killed whatever the test did."""
    cluster = RayNodes()
    try:
        yield cluster
    finally:
        cluster.stop()


def _jobs(count: int) -> list[dict]:
    return [{"id": f"shot{i:02d}", "prompt": f"shot {i}"} for i in range(count)]


def _wait_until(condition, run: subprocess.Popen, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert run.poll() is None, f"{what} did not happen: the run ended\n{run.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:g}s"
        time.sleep(0.1)


def _assert_every_job_done_once(root: Path, jobs: list[dict]) -> None:
    assert {entry["state"] for entry in state(root)["jobs"].values()} == {"done"}
    media = sorted(f"test/{job['id']}_s0.mp4" for job in jobs)
    assert output_files(root) == sorted(media + [m + ".json" for m in media]) and not temp_files(root)


def _node_of(root: Path, key: str) -> str:
    return json.loads((root / f"test/{key}_s0.mp4.json").read_text())["worker"]["node"]


def _ready_on(root: Path, node_id: str) -> int:
    """How many of the run's workers are ready on node `node_id`."""
    log = root / ".farm/test/events.jsonl"
    return sum(e["event"] == "worker_ready" and e["node"] == node_id for e in events(root)) if log.exists() else 0


def test_a_killed_raylet_costs_no_render_and_the_cli_says_so_in_one_line(nodes, tmp_path):
    # Ray marks a node dead after health checks fail in a row (defaults: 5, 3 s apart): 1 s apart here.
    nodes.start_head('--system-config={"health_check_period_ms": 1000, "health_check_failure_threshold": 3}')
    doomed = nodes.add_node("doomed", gpus=2, cpus=2)
    kept = nodes.add_node("kept", gpus=2, cpus=2)
    doomed_id = doomed.node_id()
    jobs = _jobs(40)  # ~1 s each: after the kill the 2 workers left need ~20 s, the dead node's verdict ~3 s
    root = tmp_path / "out"
    path = write_manifest(tmp_path, jobs, defaults={"steps": 100})
    run = subprocess.Popen([*FARM, str(path), "--address", nodes.address, *OPTIONS], cwd=REPO, env=nodes.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until(lambda: _ready_on(root, doomed_id) == 2 and started_on(root, doomed_id), run,
                    "both workers ready on the doomed node, and a job started there")
        # What a raylet writes to its stderr reaches the driver through Ray's log forwarding, as the dying
        # raylet's state dump does.
        kept.raylet_err().open("a").write("[state-dump] NodeManager:\n[state-dump] Node ID: test\n")
        nodes.kill_raylet(doomed)
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()

    assert run.returncode == 0, err
    _assert_every_job_done_once(root, jobs)
    run_events = events(root)
    lost = [e for e in run_events if e["event"] == "node_lost"]
    assert [(e["node"], e["workers"]) for e in lost] == [(doomed_id, 2)]
    requeued = [e for e in run_events if e["event"] in ("job_retry", "job_requeued") and "lost" in e["error"]]
    assert lost[0]["jobs"] == len(requeued) >= 1
    assert all(_node_of(root, e["key"]) != doomed_id for e in requeued)
    # The user reads one line about the node, none of a raylet's own.
    assert sum("node_lost" in line for line in err.splitlines()) == 1
    assert "[state-dump]" not in err + out
