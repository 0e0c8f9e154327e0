"""Nodes leave and join a `ray.cluster_utils.Cluster` mid-run; the driver runs as `farm submit` in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from tests.farm.helpers import assert_every_job_done_once, events, started_on, wait_while_running, write_manifest

REPO = Path(__file__).parents[2]
JOBS = [{"id": f"clip{i}", "prompt": f"shot {i}"} for i in range(6)]  # ~1 s each with 100 fake steps


@pytest.fixture(scope="module")
def cluster():
    """The head node, with one GPU; each test adds the nodes it needs and removes them. Tests start with
    `wait_for_nodes`: a node removed by an earlier test must be dead to Ray too, or it is counted as GPUs."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1})
    yield cluster
    cluster.shutdown()


def _submit(path: Path, cluster: Cluster | None) -> subprocess.Popen:
    """`farm submit` on `cluster`, or without --address (and without RAY_ADDRESS) when it is None."""
    command = [sys.executable, "-m", "farm", "submit", str(path), "--pipeline", "worker.fake:factory",
               "--no-progress", "--start-timeout", "60"]
    command += ["--address", cluster.address] if cluster else []
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_node_removed_mid_run_loses_no_render_and_duplicates_none(cluster, tmp_path):
    second = cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes(timeout=60)
    path = write_manifest(tmp_path, JOBS, defaults={"steps": 100})
    root = tmp_path / "out"
    run = _submit(path, cluster)

    wait_while_running(lambda: started_on(root, second.node_id), run, "a job reaching the second node")
    lost = started_on(root, second.node_id)[-1]
    cluster.remove_node(second, allow_graceful=False)
    _, err = run.communicate(timeout=180)

    assert run.returncode == 0, err
    assert_every_job_done_once(root, JOBS)
    kinds = [e["event"] for e in events(root)]
    assert "worker_lost" in kinds
    sidecar = json.loads((root / f"test/{lost}_s0.mp4.json").read_text())
    assert sidecar["worker"]["node"] != second.node_id and sidecar["attempt"] == 2


def test_a_node_added_mid_run_takes_jobs_from_the_running_manifest(cluster, tmp_path):
    jobs = [{"id": f"shot{i}", "prompt": f"shot {i}"} for i in range(10)]  # ~2 s each: 20 s on one GPU
    path = write_manifest(tmp_path, jobs, defaults={"steps": 200})
    root = tmp_path / "out"
    cluster.wait_for_nodes(timeout=60)
    run = _submit(path, cluster)
    head = cluster.head_node.node_id

    wait_while_running(lambda: started_on(root, head), run, "a job starting on the head")
    joined = cluster.add_node(num_cpus=2, num_gpus=1)
    try:
        _, err = run.communicate(timeout=180)
    finally:
        cluster.remove_node(joined)

    assert run.returncode == 0, err
    assert_every_job_done_once(root, jobs)
    assert [e["slot"] for e in events(root) if e["event"] == "worker_added"] == [1]
    on_joined = started_on(root, joined.node_id)
    assert on_joined, "the node that joined mid-run rendered nothing"
    sidecars = [json.loads((root / f"test/{key}_s0.mp4.json").read_text()) for key in on_joined]
    assert {s["worker"]["node"] for s in sidecars} == {joined.node_id}


def test_submit_without_an_address_starts_its_own_cluster_beside_a_running_one(cluster, tmp_path):
    # Plain ray.init() would join the newest cluster on this machine (this module's) instead.
    path = write_manifest(tmp_path, [{"id": "solo", "prompt": "shot"}])
    run = _submit(path, None)
    _, err = run.communicate(timeout=120)

    assert run.returncode == 0, err
    sidecar = json.loads((tmp_path / "out/test/solo_s0.mp4.json").read_text())
    assert sidecar["worker"]["node"] not in {node.node_id for node in cluster.list_all_nodes()}
