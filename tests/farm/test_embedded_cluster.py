"""The cluster `farm submit` starts when given no address: what it listens on, and what an interrupt leaves of it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.farm import processes
from tests.farm.helpers import wait_while_running, write_manifest

REPO = Path(__file__).parents[2]


def _events(root: Path) -> list[str]:
    log = root / ".farm" / "test" / "events.jsonl"
    return [json.loads(line)["event"] for line in log.read_text().splitlines()] if log.exists() else []


def test_an_embedded_cluster_listens_on_loopback_only(tmp_path, farm):
    gate = tmp_path / "gate"
    path = write_manifest(tmp_path, [{"id": "a", "prompt": f"x wait-for {gate}"}])
    run = farm("submit", str(path), "--start-timeout", "120", pipeline="tests.farm.fakes:gated")
    known: dict[int, int] = {}
    try:
        wait_while_running(lambda: "job_started" in _events(tmp_path / "out"), run, "the job to start")
        known = processes.tree(run.pid)
        sockets = processes.listening([run.pid, *known])
        # The GCS, the raylet, the dashboard and its agent's metrics port at least.
        assert len(sockets) >= 4, sockets
        assert [s for s in sockets if not processes.loopback(s[0])] == []
        gate.touch()
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    finally:
        processes.kill(known)


def test_workers_beyond_the_cores_are_refused_before_the_driver_makes_a_slot(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    command = [sys.executable, "-m", "farm", "submit", str(path), "--workers", "100000000",
               "--pipeline", "worker.fake:factory", "--no-progress"]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        err = run.stderr.read()
        _, status, usage = os.wait4(run.pid, 0)  # this child's own peak memory, which Popen does not report
        run.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if run.returncode is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, err
    assert f"--workers 100,000,000 asks for more CPU workers than the cluster's {os.cpu_count()} CPUs" in err
    assert usage.ru_maxrss < 1_500_000  # KiB: a driver with Ray loaded, not one slot per asked worker (4.5 GB)


# `farm submit` with a hook inside the embedded cluster's start: once Ray's function `argv[1]` (of
# ray._private.services, or "ready": the start's end, where the driver forwards its workers' logs) has run, the
# driver sends itself signal `argv[2]`, which lands right there, inside the start; then the command line follows.
INTERRUPTED_START = """
import os, sys
import ray._private.services as services
from farm import cli, cluster
point, signum = sys.argv[1], int(sys.argv[2])
owner, name = (cluster, "_forward_worker_logs_only") if point == "ready" else (services, point)
real = getattr(owner, name)
def hooked(*args, **kwargs):
    result = real(*args, **kwargs)
    os.kill(os.getpid(), signum)
    return result
setattr(owner, name, hooked)
sys.exit(cli.main(sys.argv[3:]))
"""
MARK = "FARM_TEST_RUN"  # in the environment of every process of one run (Ray's inherit the driver's)


def _marked(mark: str) -> list[str]:
    """The command lines of running processes whose environment carries `MARK=mark`."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if not entry.name.isdigit() or f"{MARK}={mark}".encode() not in Path(entry.path, "environ").read_bytes():
                continue
            stat = Path(entry.path, "stat").read_text()
            if stat[stat.rindex(")") + 2] != "Z":  # a zombie has ended
                found.append(Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
        except OSError:  # ended meanwhile, or another user's
            continue
    return found


def _defaults() -> None:
    # The dispositions a terminal gives: a test started from a background job inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize("point", ["start_gcs_server", "start_api_server", "start_raylet", "ready"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_while_ray_starts_leaves_no_process_and_exits_interrupted(tmp_path, point, signum):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    mark = f"{tmp_path.name}-{point}-{signum}"
    command = [sys.executable, "-c", INTERRUPTED_START, point, str(int(signum)), "submit", str(path),
               "--pipeline", "worker.fake:factory", "--no-progress"]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, MARK: mark}, preexec_fn=_defaults)
    try:
        _, err = run.communicate(timeout=300)
        left = _marked(mark)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        for pid in (int(e.name) for e in os.scandir("/proc") if e.name.isdigit()):
            with contextlib.suppress(OSError):  # whatever of the run is left, even when an assert failed
                if f"{MARK}={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    os.kill(pid, signal.SIGKILL)
    assert run.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert left == [], left
    assert json.loads((tmp_path / "out/.farm/test/state.json").read_text())["result"] == "interrupted"
