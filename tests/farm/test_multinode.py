"""`farm submit --address` and `ray job submit` on a cluster of separate `ray start` processes (testbed/ray_nodes.py):
a worker node's raylet killed mid-run, a node added mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.ray_nodes import VENV_BIN
from tests.farm.helpers import assert_every_job_done_once, events, started_on, wait_while_running, write_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
FARM = [sys.executable, "-m", "farm", "submit"]
OPTIONS = ["--pipeline", "worker.fake:factory", "--no-progress", "--start-timeout", "120"]


def _jobs(count: int) -> list[dict]:
    return [{"id": f"shot{i:02d}", "prompt": f"shot {i}"} for i in range(count)]


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
        wait_while_running(lambda: _ready_on(root, doomed_id) == 2 and started_on(root, doomed_id), run,
                    "both workers ready on the doomed node, and a job started there")
        # What a raylet writes to its stderr reaches the driver through Ray's log forwarding, as the dying
        # raylet's state dump does.
        kept.raylet_err().open("a").write("[state-dump] NodeManager:\n[state-dump] Node ID: test\n")
        nodes.kill_raylet(doomed)
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()

    assert run.returncode == 0, err
    assert_every_job_done_once(root, jobs)
    run_events = events(root)
    lost = [e for e in run_events if e["event"] == "node_lost"]
    assert [(e["node"], e["workers"]) for e in lost] == [(doomed_id, 2)]
    # Every attempt the dead node held went back to the queue: the one a worker rendered and, where it was
    # publishing the last meanwhile, that one too (requeued as its bystander).
    on_doomed = {(e["key"], e["attempt"]) for e in run_events if e["event"] == "job_started" and e["node"] == doomed_id}
    requeued = [e for e in run_events
                if e["event"] in ("job_retry", "job_requeued") and (e["key"], e["attempt"]) in on_doomed]
    assert lost[0]["jobs"] == len(requeued) >= 1
    assert all(_node_of(root, e["key"]) != doomed_id for e in requeued)
    # The user reads one line about the node, none of a raylet's own.
    assert sum("node_lost" in line for line in err.splitlines()) == 1
    assert "[state-dump]" not in err + out


def test_a_node_added_mid_run_takes_jobs_of_a_ray_job_submitted_run(nodes, tmp_path):
    nodes.start_head(dashboard=True)
    first = nodes.add_node("first", gpus=2, cpus=2)
    jobs = _jobs(40)  # ~2 s each: 40 s on the first node's 2 workers, room for a node to start and join
    root = tmp_path / "out"
    path = write_manifest(tmp_path, jobs, defaults={"steps": 200})
    # As docs/farm.md runs the driver on the cluster; the job's driver finds the cluster in RAY_ADDRESS.
    command = [str(VENV_BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{nodes.dashboard_port}",
               "--working-dir", ".", "--", "python", "-m", "farm", "submit", str(path), *OPTIONS]
    run = subprocess.Popen(command, cwd=REPO, env=nodes.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_while_running(lambda: started_on(root, first.node_id()), run, "a job starting on the first node")
        joined = nodes.add_node("joined", gpus=2, cpus=2)
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()

    assert run.returncode == 0, out + err
    assert "40 done, 0 failed" in out
    assert_every_job_done_once(root, jobs)
    assert [e["slot"] for e in events(root) if e["event"] == "worker_added"] == [2, 3]
    on_joined = started_on(root, joined.node_id())
    assert on_joined, "the node that joined mid-run rendered nothing"
    assert {_node_of(root, key) for key in on_joined} == {joined.node_id()}
