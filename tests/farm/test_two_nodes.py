"""A two-node cluster (`ray.cluster_utils.Cluster`) loses a node mid-run; the driver runs as `farm submit`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from tests.farm.helpers import events, output_files, state, temp_files, write_manifest

REPO = Path(__file__).parents[2]
JOBS = [{"id": f"clip{i}", "prompt": f"shot {i}"} for i in range(6)]  # ~1 s each with 100 fake steps


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1})
    second = cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes()
    yield cluster, second
    cluster.shutdown()


def _started_on(root: Path, node_id: str) -> list[str]:
    path = root / ".farm/test/events.jsonl"
    if not path.exists():
        return []
    return [e["key"] for e in events(root) if e["event"] == "job_started" and e["node"] == node_id]


def test_a_node_removed_mid_run_loses_no_render_and_duplicates_none(cluster, tmp_path):
    cluster, second = cluster
    path = write_manifest(tmp_path, JOBS, defaults={"steps": 100})
    root = tmp_path / "out"
    command = [sys.executable, "-m", "farm", "submit", str(path), "--address", cluster.address,
               "--pipeline", "worker.fake:factory", "--no-progress", "--start-timeout", "60"]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    deadline = time.monotonic() + 60
    while not _started_on(root, second.node_id):
        assert time.monotonic() < deadline and run.poll() is None, "no job reached the second node"
        time.sleep(0.1)
    lost = _started_on(root, second.node_id)[-1]
    cluster.remove_node(second, allow_graceful=False)
    _, err = run.communicate(timeout=180)

    assert run.returncode == 0, err
    assert {entry["state"] for entry in state(root)["jobs"].values()} == {"done"}
    media = sorted(f"test/{job['id']}_s0.mp4" for job in JOBS)
    assert output_files(root) == sorted(media + [m + ".json" for m in media]) and not temp_files(root)
    kinds = [e["event"] for e in events(root)]
    assert "worker_lost" in kinds
    sidecar = json.loads((root / f"test/{lost}_s0.mp4.json").read_text())
    assert sidecar["worker"]["node"] != second.node_id and sidecar["attempt"] == 2
