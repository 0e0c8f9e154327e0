"""Shared by farm and worker tests: output checks, events and state, a local Ray cluster. A run's inputs (checkpoint,
manifest, media) are testbed.farm_inputs', which the benchmarks share; the tests take them from here too."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from farm import storage
from testbed.farm_inputs import make_checkpoint, write_image, write_manifest, write_video  # noqa: F401 - for the tests


def scale_one_tensor_in_place(shard: Path) -> None:
    """Doubles the first bf16 value of a shard's data (1.0 -> 2.0), or halves it back: same size, same header, same
    inode (a fine-tune written in place, and its rollback)."""
    data = bytearray(shard.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # safetensors: u64 header length, header, data
    one, two = bytes.fromhex("803f"), bytes.fromhex("0040")  # bf16 1.0 and 2.0, little-endian
    assert data[start:start + 2] in (one, two)
    data[start:start + 2] = two if data[start:start + 2] == one else one
    with open(shard, "r+b") as handle:
        handle.write(data)


def publish(job, *, run: str, attempt: int = 1, data: bytes = b"video bytes") -> None:
    """Publishes `job` the way a worker does, with made-up media bytes."""
    media = storage.publish(Path(job.media), lambda out: out.write(data))
    storage.write_json(storage.sidecar_path(job.media), storage.sidecar_record(job, run, attempt, media))


def output_files(root: Path) -> list[str]:
    """Every file under an output root except the farm's own records, relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".farm" not in p.parts)


def wait_while_running(condition, run: subprocess.Popen, what: str, seconds: float = 120) -> None:
    """Returns once `condition()` holds; fails if `run` (a `farm submit` with its stderr piped) ends first, with
    its stderr's tail, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert run.poll() is None, f"{what} did not happen: the run ended\n{run.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:g}s"
        time.sleep(0.1)


def assert_every_job_done_once(root: Path, jobs: list[dict]) -> None:
    """Each job of a manifest written by `write_manifest` (one seed each) is done: its media and sidecar, nothing
    else, no temp file."""
    assert {entry["state"] for entry in state(root)["jobs"].values()} == {"done"}
    media = sorted(f"test/{job['id']}_s0.mp4" for job in jobs)
    assert output_files(root) == sorted(media + [m + ".json" for m in media]) and not temp_files(root)


def temp_files(root: Path) -> list[str]:
    return [name for name in output_files(root) if Path(name).name.endswith(".tmp")]


def events(root: Path, name: str = "test") -> list[dict]:
    path = root / ".farm" / name / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def started_on(root: Path, node_id: str) -> list[str]:
    """Keys of the jobs whose attempts started on node `node_id`, in order (none before the event log exists)."""
    if not (root / ".farm" / "test" / "events.jsonl").exists():
        return []
    return [e["key"] for e in events(root) if e["event"] == "job_started" and e["node"] == node_id]


def state(root: Path, name: str = "test") -> dict:
    return json.loads((root / ".farm" / name / "state.json").read_text())


@contextlib.contextmanager
def local_cluster(**options: Any) -> Iterator[None]:
    """One Ray cluster for a test module: starting one costs seconds, so modules share it. `options` go to
    ray.init (resources; include_dashboard=True where a test reads the state API)."""
    ray.init(**{"address": "local", "include_dashboard": False, **options})  # never another test run's cluster
    try:
        yield
    finally:
        ray.shutdown()


def render_and_publish(worker, job, attempt: int = 1) -> dict:
    """An attempt as the driver runs it on a RenderWorker actor: its render, then its publish's summary."""
    ray.get(worker.render.remote(job, attempt))
    return ray.get(worker.publish.remote(job, attempt))
