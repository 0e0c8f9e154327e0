"""The scale path at small size: hundreds of jobs over 32 logical GPUs on 4 Ray nodes, and the costs that must not
grow with the square of a manifest's jobs (a start-of-run sweep per job, `farm status` importing Ray). The figures
at 1,000 to 10,000 jobs are benchmarks/bench_scheduler.py --scale's, never asserted here."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from farm import cli, driver, manifest, storage
from tests.farm import fakes
from tests.farm.helpers import events, output_files, publish, state, temp_files, write_manifest

REPO = Path(__file__).resolve().parents[2]
NODES, GPUS_PER_NODE = 4, 8


@pytest.mark.slow
def test_200_jobs_on_32_gpus_of_4_nodes_are_each_published_once(tmp_path, capsys):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": GPUS_PER_NODE, "num_gpus": GPUS_PER_NODE})
    try:
        for _ in range(NODES - 1):
            cluster.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
        cluster.wait_for_nodes(timeout=120)
        ray.init(address=cluster.address)
        jobs = [{"id": f"j{i}", "prompt": "p", "seed": i, "steps": 1 + i % 5} for i in range(200)]
        path = write_manifest(tmp_path, jobs, defaults={"task": "t2i", "size": [16, 16]})
        (tmp_path / "markers").mkdir()
        factory = functools.partial(fakes.every_worker_first, markers=str(tmp_path / "markers"),
                                    workers=NODES * GPUS_PER_NODE, seconds_per_step=0.002)
        report = driver.submit(manifest.load(path), driver.SubmitOptions(factory=factory, progress=False))
    finally:
        ray.shutdown()
        cluster.shutdown()

    root = tmp_path / "out"
    assert report.ok, report.counts
    log = events(root)
    assert Counter(e["key"] for e in log if e["event"] == "job_done") == {job["id"]: 1 for job in jobs}
    # One worker per GPU, each on a GPU of its own: no job finishes before all of them have begun one.
    ready = [e for e in log if e["event"] == "worker_ready"]
    assert sorted(e["slot"] for e in ready) == list(range(NODES * GPUS_PER_NODE))
    assert len({(e["node"], gpu) for e in ready for gpu in e["gpu"]}) == NODES * GPUS_PER_NODE
    assert len({e["node"] for e in ready}) == NODES
    assert {entry["state"] for entry in state(root)["jobs"].values()} == {"done"}
    assert len(output_files(root)) == 2 * len(jobs) and not temp_files(root)
    capsys.readouterr()  # Ray's own output
    assert cli.main(["status", str(root), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["manifests"][0]["done"] == len(jobs)


def test_farm_status_does_not_import_ray():
    # Ray's import alone takes about a second: more than `farm status` may take on 10,000 jobs.
    probe = "import sys, farm.cli; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_farm_status_counts_a_truncated_or_deleted_output_pending_by_its_size(tmp_path, capsys):
    path = write_manifest(tmp_path, [{"id": i, "prompt": "p"} for i in ("kept", "cut", "gone")])
    m = manifest.load(path)
    for job in m.jobs:
        publish(job, run="r1")
    assert cli.main(["submit", str(path)]) == 0  # all done: the records only
    media = {job.key: Path(job.media) for job in m.jobs}
    media["cut"].write_bytes(b"video")  # shorter than its sidecar's size
    media["gone"].unlink()
    capsys.readouterr()

    assert cli.main(["status", str(tmp_path / "out"), "--output", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["manifests"][0]
    assert (row["done"], row["pending"]) == (1, 2)


def test_one_sweep_removes_the_leftovers_of_many_jobs_of_a_folder_and_only_theirs(tmp_path):
    jobs = [{"id": f"j{i}", "prompt": "p"} for i in range(50)]
    # A glob character in the file names matches only itself: `[x]j0` is no pattern for `xj0`.
    m = manifest.load(write_manifest(tmp_path, jobs, output={"path": "[x]{id}"}))
    folder = Path(m.jobs[0].media).parent
    folder.mkdir(parents=True)
    leftovers = [storage.temp_path(Path(job.media)).name for job in m.jobs]
    leftovers += [storage.temp_path(storage.sidecar_path(job.media)).name for job in m.jobs]
    token = "0123456789abcdef"  # a temp's random part: 16 hex digits
    kept = [f".xj0.mp4.{token}.tmp", f".j0.mp4.{token}.tmp", "[x]j0.mp4", f".[x]j0.mp4.{token[:15]}.tmp",
            f".[x]j0.mp4.{token[:15]}g.tmp"]
    for name in leftovers + kept:
        (folder / name).write_bytes(b"x")

    assert storage.discard_temps(*m.jobs) == len(leftovers)
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept)
