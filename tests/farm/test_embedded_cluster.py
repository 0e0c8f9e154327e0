"""The cluster `farm submit` starts when given no address: what it listens on, and what an interrupt leaves of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

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
