"""Through the driver: one writer per root and manifest name (on one Ray cluster also when the storage lease would
let a second in), a SIGKILLed driver's run, storage faults (a full disk, a deleted or read-only root) and encodes
that do not read back."""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray._common.utils import get_default_system_temp_dir

from farm import cli, cluster, cluster_lock, driver, lease, manifest, reaper, storage
from farm.processes import pid_alive
from tests.farm import fakes
from tests.farm.helpers import events, local_cluster, output_files, publish, state, temp_files, write_manifest
from worker import fake

REPO = Path(__file__).parents[2]
SLOW_JOBS = [{"id": f"clip{i}", "prompt": f"shot {i}", "seed": i} for i in range(4)]  # ~1 s each at 100 steps


@pytest.fixture(scope="module")
def address():
    with local_cluster(num_gpus=2, num_cpus=4):
        yield ray.get_runtime_context().gcs_address


def _wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _lease(root: Path) -> Path:
    return root / ".farm" / "test" / lease.LEASE_FILE


def _logged(root: Path, event: str) -> list[dict]:
    log = root / ".farm" / "test" / "events.jsonl"
    return [e for e in events(root) if e["event"] == event] if log.exists() else []


def _submit_cli(path: Path, pipeline, *extra: str) -> int:
    args = cli.build_parser().parse_args(["submit", str(path), "--no-progress", *extra])
    args.pipeline = pipeline
    return args.func(args)


# -- one writer ----------------------------------------------------------------------------------------


def test_two_drivers_on_one_root_render_every_job_exactly_once(address, tmp_path, farm):
    path = write_manifest(tmp_path, SLOW_JOBS, defaults={"steps": 100})
    root = tmp_path / "out"
    first = farm("submit", str(path), "--address", address, "--wait")
    _wait_for(lambda: _logged(root, "job_started"))
    second = farm("submit", str(path), "--address", address, "--wait")
    outputs = [run.communicate(timeout=300) for run in (first, second)]

    assert [first.returncode, second.returncode] == [0, 0], outputs
    assert Counter(e["key"] for e in _logged(root, "job_started")) == {job["id"]: 1 for job in SLOW_JOBS}
    assert f"0 done, 0 failed, 0 pending, {len(SLOW_JOBS)} skipped" in outputs[1][0]
    assert len(output_files(root)) == 2 * len(SLOW_JOBS) and not temp_files(root) and not _lease(root).exists()


def test_a_second_submit_without_wait_is_refused_naming_the_running_driver(address, tmp_path, farm):
    path = write_manifest(tmp_path, SLOW_JOBS, defaults={"steps": 100})
    root = tmp_path / "out"
    first = farm("submit", str(path), "--address", address)
    _wait_for(lambda: _logged(root, "job_started"))
    holder = lease.read(_lease(root))
    second = farm("submit", str(path), "--address", address)
    _, err = second.communicate(timeout=120)

    assert second.returncode == 1
    assert f"is being rendered by run {holder.run} (pid {first.pid} on {holder.host}" in err
    assert "wait for it (farm submit --wait)" in err and "Traceback" not in err
    first.communicate(timeout=300)
    assert first.returncode == 0


def test_another_manifest_with_the_same_name_in_the_same_root_is_refused(tmp_path, capsys):
    shared = {"root": str(tmp_path / "renders")}
    one = write_manifest(tmp_path / "one", [{"id": "a", "prompt": "x"}], output=shared)
    publish(manifest.load(one).jobs[0], run="earlier")
    assert cli.main(["submit", str(one)]) == 0  # all done: records only
    two = write_manifest(tmp_path / "two", [{"id": "b", "prompt": "y"}], output=shared)
    capsys.readouterr()

    assert cli.main(["submit", str(two)]) == 1
    err = capsys.readouterr().err
    assert f"already holds the renders of another manifest named 'test' ({one})" in err and "change name:" in err


def test_a_sigkilled_driver_shows_as_interrupted_and_leaves_no_worker_running(address, tmp_path, capsys, farm):
    path = write_manifest(tmp_path, SLOW_JOBS, defaults={"steps": 100})
    root = tmp_path / "out"
    run = farm("submit", str(path), "--address", address)
    _wait_for(lambda: _logged(root, "job_started"))
    workers = [e["pid"] for e in _logged(root, "worker_ready")]
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=60)

    assert state(root)["result"] == "running"  # what the killed driver last wrote
    assert cli.main(["status", str(root), "--output", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["manifests"][0]
    assert row["last_run"].endswith("(interrupted: its driver is gone)")
    # Ray ends the actors of a driver that died; none of its workers keeps rendering.
    _wait_for(lambda: not any(pid_alive(pid) for pid in workers), timeout=60)

    report = driver.submit(manifest.load(path), driver.SubmitOptions(factory=fake.factory, progress=False))
    assert report.ok and not temp_files(root)  # the dead driver's lease taken over at once: same host, pid gone


@pytest.fixture
def own_temp_dir() -> Iterator[tuple[Path, dict]]:
    """An empty $TMPDIR for a `farm submit` child, and the environment that gives it; Ray's sessions stay where
    they go for this process. A short path: Ray's dashboard puts an AF_UNIX socket (at most 107 bytes) in it."""
    with tempfile.TemporaryDirectory(prefix="farm-test-") as temp:
        yield Path(temp), {**os.environ, "TMPDIR": temp, "RAY_TMPDIR": get_default_system_temp_dir()}


def test_an_embedded_cluster_leaves_nothing_in_the_temp_dir(tmp_path, farm, own_temp_dir):
    """Ray SIGKILLs its dashboard at shutdown, which leaves its multiprocessing folder (`pymp-*`) behind."""
    temp, env = own_temp_dir
    path = write_manifest(tmp_path, SLOW_JOBS[:1])
    run = farm("submit", str(path), env=env, output=subprocess.DEVNULL)
    assert run.wait(timeout=300) == 0
    assert list(temp.iterdir()) == []


def test_ctrl_c_while_the_embedded_cluster_starts_leaves_nothing_in_the_temp_dir(tmp_path, monkeypatch):
    def interrupted(**_):
        raise KeyboardInterrupt

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cluster.connect(None)
    assert list(temp.iterdir()) == []


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="farm.reaper reads /proc")
def test_a_sigkilled_driver_of_an_embedded_cluster_leaves_no_ray_process(tmp_path, farm, own_temp_dir):
    """Ray's dashboard and runtime-env agents outlive a SIGKILLed driver; farm.reaper ends them, and removes
    what the cluster's processes left in the temp dir."""
    temp, env = own_temp_dir
    path = write_manifest(tmp_path, SLOW_JOBS, defaults={"steps": 300})
    root = tmp_path / "out"
    run = farm("submit", str(path), env=env, output=subprocess.DEVNULL)
    _wait_for(lambda: _logged(root, "job_started"))
    ours = reaper.descendants(reaper.processes(), run.pid)
    assert len(ours) > 5  # gcs, raylet, dashboard, agents, workers, the reaper
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=60)

    def left() -> dict[int, int]:
        table = reaper.processes()
        return {pid: start for pid, start in ours.items() if table.get(pid, (0, None))[1] == start}

    _wait_for(lambda: not left(), timeout=60)
    _wait_for(lambda: list(temp.iterdir()) == [], timeout=60)  # the reaper removes it once they are gone


# -- one writer on one Ray cluster: its lock, whatever the storage lease says --------------------------
# JOBS jobs wait for a gate file, so the first driver still renders while the second tries.

JOBS = 3


def _gated_manifest(tmp_path: Path) -> tuple[Path, Path]:
    """A manifest whose jobs render only once the returned gate file exists."""
    gate = tmp_path / "gate"
    jobs = [{"id": f"clip{i}", "prompt": f"shot {i} wait-for {gate}"} for i in range(JOBS)]
    return write_manifest(tmp_path, jobs), gate


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
    _wait_for(lambda: _logged(root, "job_started"))
    return first, root


def test_a_driver_frozen_past_the_lease_rule_keeps_its_manifest_on_the_cluster(address, tmp_path, farm,
                                                                                 monkeypatch):
    path, gate = _gated_manifest(tmp_path)
    first, root = _first_driver(farm, path, address)
    lease_path = _lease(root)
    held = lease.read(lease_path)
    first.send_signal(signal.SIGSTOP)  # frozen: no touch of its lease, but Ray still counts its driver alive
    try:
        records = _records(root)
        # The storage lease alone would give the manifest away: its holder's liveness says dead.
        monkeypatch.setattr(lease, "is_running", lambda pid, known_as: False)
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


def test_a_driver_whose_cluster_lock_is_ended_stops_its_run_and_says_why(address, tmp_path, farm):
    path, _gate = _gated_manifest(tmp_path)
    first, root = _first_driver(farm, path, address)
    ray.kill(ray.get_actor(cluster_lock.name(root, "test"), namespace=cluster_lock.NAMESPACE), no_restart=True)
    out, err = first.communicate(timeout=120)  # its watch looks every cluster_lock.WATCH seconds
    assert first.returncode != 0, out
    assert f"run stopped: its cluster lock {cluster_lock.name(root, 'test')} (namespace farm) was ended" in err
    assert not _logged(root, "job_done")  # every job still waited for its gate: none was published


# -- joining a cluster that uses token authentication ------------------------------------------------


def _without_auth_settings(**changes: str) -> dict:
    """This environment less RAY_AUTH_MODE (which the test cluster's ray.init put there) and its kin."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}, **changes}


def test_address_host_port_joins_a_token_auth_cluster_with_the_token_on_this_machine(address, tmp_path, farm):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    run = farm("submit", str(path), "--address", address, env=_without_auth_settings())
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err  # was: ~20 s of InvalidAuthToken warnings, then a failure
    assert "1 done, 0 failed" in out


def test_address_host_port_without_a_token_says_what_to_set(address, tmp_path, farm):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    (tmp_path / "home").mkdir()
    run = farm("submit", str(path), "--address", address, env=_without_auth_settings(HOME=str(tmp_path / "home")))
    _, err = run.communicate(timeout=300)
    assert run.returncode == 1 and "Traceback" not in err
    assert "copy the head's ~/.ray/auth_token to ~/.ray/auth_token here, or set RAY_AUTH_TOKEN" in err


# -- storage faults ------------------------------------------------------------------------------------


def test_a_full_disk_fails_its_jobs_naming_enospc_and_retires_no_worker(address, tmp_path, capsys):
    jobs = [{"id": f"clip{i}", "prompt": "x", "seed": i, "retries": 1} for i in range(4)]
    path = write_manifest(tmp_path, jobs)
    assert _submit_cli(path, fakes.full_scratch) == 1
    out = capsys.readouterr()
    root = tmp_path / "out"

    failed = _logged(root, "job_failed")
    assert len(failed) == 4 and all("StorageFault: ENOSPC: encoding needs about" in e["error"] for e in failed)
    assert not _logged(root, "worker_retired") and "StorageFault: ENOSPC" in out.err + out.out
    assert output_files(root) == []


def test_an_encode_that_does_not_read_back_is_retried_never_done(address, tmp_path):
    (tmp_path / "markers").mkdir()
    jobs = [{"id": f"clip{i}", "prompt": "x", "seed": i} for i in range(2)]
    path = write_manifest(tmp_path, jobs)
    factory = functools.partial(fakes.truncating_once, markers=str(tmp_path / "markers"))
    assert _submit_cli(path, factory) == 0
    root = tmp_path / "out"

    retried = _logged(root, "job_retry")
    assert len(retried) == 2 and all("EncodeError" in e["error"] and "does not read back" in e["error"]
                                     for e in retried)
    assert {e["key"]: e["attempt"] for e in _logged(root, "job_done")} == {"clip0": 2, "clip1": 2}
    for job in manifest.load(path).jobs:
        assert storage.is_done(job)


def test_a_root_deleted_mid_run_fails_the_run_loudly_and_stays_deleted(address, tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "REFRESH", 0.05)
    path = write_manifest(tmp_path, SLOW_JOBS, defaults={"steps": 100})
    root = tmp_path / "out"
    m = manifest.load(path)
    options = driver.SubmitOptions(factory=fake.factory, progress=False)
    deleted = []

    def delete_when_started() -> None:
        _wait_for(lambda: _logged(root, "job_started"))
        shutil.rmtree(root)
        deleted.append(True)

    thread = threading.Thread(target=delete_when_started)
    thread.start()
    report = driver.submit(m, options)
    thread.join()

    assert deleted and not report.ok and not root.exists()
    assert "vanished" in report.error
    assert "error: " in cli._report_result(report).text


def _unshare_available() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_available(), reason="needs unshare -rm to mount a folder read-only")
def test_a_read_only_root_is_refused_at_validate_and_at_submit_without_a_traceback(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    root = tmp_path / "out"
    root.mkdir()
    farm = f"{sys.executable} -m farm"
    script = (f"mount --bind -o ro {root} {root} && "
              f"{{ {farm} validate {path}; echo validate=$?; {farm} submit {path} --pipeline worker.fake:factory; "
              f"echo submit=$?; }}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, capture_output=True, text=True)
    assert "validate=1" in done.stdout and "submit=1" in done.stdout, done.stdout + done.stderr
    assert done.stderr.count(f"{root} is on a read-only file system; mount it read-write") == 2, done.stderr
    assert "Traceback" not in done.stderr


def test_a_disk_that_fills_mid_run_ends_it_with_its_state_written_and_no_torn_event(address, tmp_path, monkeypatch):
    """Issue 49, defect 17: once an event cannot be appended, the run stops, and says why."""
    path = write_manifest(tmp_path, SLOW_JOBS, defaults={"steps": 20})
    root = tmp_path / "out"
    real = os.write
    full = threading.Event()

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("events.jsonl"):
            if full.is_set():
                real(fd, data[:len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if b'"job_done"' in data:
                full.set()  # the disk fills once the first job is logged done
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    report = driver.submit(manifest.load(path), driver.SubmitOptions(address=address, factory=fake.factory,
                                                                     progress=False, workers=1))
    monkeypatch.undo()
    assert report.error.startswith("run stopped: ENOSPC (No space left on device) appending to ")
    assert state(root)["result"] == "failed" and report.summary_path
    logged = [json.loads(line)["event"] for line in (root / ".farm/test/events.jsonl").read_text().splitlines()]
    assert logged.count("job_done") == 1 and logged[-1] == "job_done"  # whole lines only, none after the fault
    assert report.counts["pending"] >= 1
