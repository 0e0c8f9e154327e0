"""The cluster `farm submit` starts when given no address: what it listens on, and what an interrupt leaves of it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.farm import processes
from tests.farm.helpers import wait_while_running, write_manifest


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
