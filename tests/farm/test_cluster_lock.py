"""Two drivers of one manifest on one Ray cluster: Ray's lock refuses the second even when the storage lease would
not (its holder frozen past the lease's rule), and frees it once the first driver ends or is SIGKILLed."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest
import ray

from farm import cluster_lock, driver, lease, manifest
from tests.farm.helpers import local_cluster, output_files, state, write_manifest
from worker import fake

JOBS = 3


@pytest.fixture(scope="module")
def address():
    with local_cluster(num_gpus=2, num_cpus=4):
        yield ray.get_runtime_context().gcs_address


def _wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _gated_manifest(tmp_path: Path) -> tuple[Path, Path]:
    """A manifest whose jobs render only once the returned gate file exists."""
    gate = tmp_path / "gate"
    jobs = [{"id": f"clip{i}", "prompt": f"shot {i} wait-for {gate}"} for i in range(JOBS)]
    return write_manifest(tmp_path, jobs), gate


def _started(root: Path) -> bool:
    log = root / ".farm" / "test" / "events.jsonl"
    return log.exists() and any(json.loads(line)["event"] == "job_started" for line in log.read_text().splitlines())


def _lock_exists(root: Path) -> bool:
    try:
        ray.get_actor(cluster_lock.name(root, "test"), namespace=cluster_lock.NAMESPACE)
    except ValueError:
        return False
    return True


def _records(root: Path) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_ino, p.read_bytes()) for p in (root / ".farm").rglob("*") if p.is_file()}


def _first_driver(farm, path: Path, address: str):
    root = path.parent / "out"
    first = farm("submit", str(path), "--address", address, pipeline="tests.farm.fakes:gated")
    _wait_for(lambda: _started(root))
    return first, root


def test_a_driver_frozen_past_the_lease_rule_keeps_its_manifest_on_the_cluster(address, tmp_path, farm,
                                                                                 monkeypatch):
    path, gate = _gated_manifest(tmp_path)
    first, root = _first_driver(farm, path, address)
    lease_path = root / ".farm" / "test" / lease.LEASE_FILE
    held = lease.read(lease_path)
    first.send_signal(signal.SIGSTOP)  # frozen: no touch of its lease, but Ray still counts its driver alive
    try:
        records = _records(root)
        # The storage lease alone would give the manifest away: its holder's liveness says dead.
        monkeypatch.setattr(lease, "pid_alive", lambda pid: False)
        assert lease.Watch().judge(lease.look(lease_path)) is lease.Verdict.DEAD
        with pytest.raises(lease.LeaseHeld) as refused:  # (not refused: no GPU is free for it, it ends in 30 s)
            driver.submit(manifest.load(path), driver.SubmitOptions(factory=fake.factory, progress=False,
                                                                    start_timeout=30))
        monkeypatch.undo()
    finally:
        first.send_signal(signal.SIGCONT)

    assert (f"is being rendered by run {held.run} (pid {first.pid} on {socket.gethostname()}"
            in str(refused.value)) and "wait for it (farm submit --wait)" in str(refused.value)
    # Refused before touching anything: the first driver's lease and records are as it left them.
    assert _records(root) == records
    gate.touch()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err  # its run was not stopped: nobody took its lease
    assert not _lock_exists(root)

    report = driver.submit(manifest.load(path), driver.SubmitOptions(factory=fake.factory, progress=False))
    assert report.ok and len(report.skipped) == JOBS and state(root)["run"] == report.run_id


def test_a_sigkilled_drivers_lock_is_freed_once_ray_sees_it_gone(address, tmp_path, farm):
    path, gate = _gated_manifest(tmp_path)
    first, root = _first_driver(farm, path, address)
    assert _lock_exists(root)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    _wait_for(lambda: not _lock_exists(root), timeout=60)  # Ray ends the actors of a driver that is gone

    gate.touch()
    report = driver.submit(manifest.load(path), driver.SubmitOptions(factory=fake.factory, progress=False))
    assert report.ok and len(report.outcomes) == JOBS and len(output_files(root)) == 2 * JOBS
    assert not _lock_exists(root)
