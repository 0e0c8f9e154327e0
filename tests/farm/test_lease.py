"""The lease that makes one driver the writer of a manifest name in an output root."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farm import lease


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "out" / ".farm" / "city" / lease.LEASE_FILE


def _owner(run: str, **changes) -> lease.Owner:
    return dataclasses.replace(lease.Owner.this_process(run, "/jobs/city.yaml"), **changes)


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_live_lease_refuses_a_second_driver_naming_its_holder(path):
    held = lease.acquire(path, _owner("run-a"))
    with pytest.raises(lease.LeaseHeld, match=rf"city in .*out is being rendered by run run-a \(pid {os.getpid()} "
                                              r"on .*, manifest /jobs/city.yaml\); wait for it \(farm submit --wait\)"):
        lease.acquire(path, _owner("run-b"))
    held.release()
    assert not path.exists()
    lease.acquire(path, _owner("run-b")).release()


def test_the_lease_of_a_dead_driver_on_this_host_is_taken_over_at_once(path):
    lease.acquire(path, _owner("killed", pid=_dead_pid()))  # never released: SIGKILLed
    assert lease.holder(path) is None
    held = lease.acquire(path, _owner("next"))
    assert lease.read(path).run == "next" and lease.holder(path) == held.owner


def test_a_lease_from_another_host_is_live_until_it_goes_untouched_for_stale_seconds(path):
    lease.acquire(path, _owner("remote", host="another-host", pid=1))
    with pytest.raises(lease.LeaseHeld):
        lease.acquire(path, _owner("here"))
    old = time.time() - lease.STALE - 1
    os.utime(path, (old, old))
    assert lease.holder(path) is None
    assert lease.acquire(path, _owner("here")).owner.run == "here"


def test_a_takeover_that_finds_the_lease_already_replaced_puts_it_back(path):
    stale = _owner("stale", pid=_dead_pid())
    lease.acquire(path, stale)
    path.unlink()
    lease.acquire(path, _owner("winner"))  # another driver took the stale lease over first
    lease._take_over(path, stale)  # this one had judged the old lease stale
    assert lease.read(path).run == "winner" and [p.name for p in path.parent.iterdir()] == [path.name]


def test_wait_waits_for_the_holder_to_release(path):
    held = lease.acquire(path, _owner("first"))
    waiting, result = threading.Event(), {}

    def second() -> None:
        result["lease"] = lease.acquire(path, _owner("second"), wait=True, on_wait=lambda holder: waiting.set(),
                                        poll=0.01)

    thread = threading.Thread(target=second)
    thread.start()
    assert waiting.wait(30)
    assert "lease" not in result
    held.release()
    thread.join(30)
    assert result["lease"].owner.run == "second" and lease.read(path).run == "second"


@pytest.mark.parametrize("change", ["deleted", "taken-over"])
def test_a_driver_that_loses_its_lease_is_told_why(path, monkeypatch, change):
    monkeypatch.setattr(lease, "REFRESH", 0.01)
    held = lease.acquire(path, _owner("mine"))
    reasons: list[str] = []
    told = threading.Event()
    held.keep(lambda reason: (reasons.append(reason), told.set()))
    if change == "deleted":
        path.unlink()
    else:
        path.write_text(path.read_text().replace('"mine"', '"thief"'))
    assert told.wait(30)
    expected = "vanished (was the output root deleted" if change == "deleted" else "run thief (pid"
    assert expected in reasons[0]
    held.release()
    assert change == "deleted" or lease.read(path).run == "thief"  # never removes another driver's lease


def test_a_held_lease_is_touched_while_it_runs(path, monkeypatch):
    monkeypatch.setattr(lease, "REFRESH", 0.01)
    held = lease.acquire(path, _owner("mine"))
    old = time.time() - lease.STALE - 1
    os.utime(path, (old, old))
    held.keep(lambda reason: None)
    deadline = time.monotonic() + 30
    while path.stat().st_mtime < time.time() - lease.STALE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.holder(path) is not None
    held.release()
