"""The lease that makes one driver the writer of a manifest name in an output root, whatever its holders' clocks."""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farm import cli, lease, processes
from tests.farm.helpers import write_manifest

ROOT = Path(__file__).resolve().parents[2]
# A driver on another host sharing the storage, its clock SKEW seconds off: it takes the lease at argv[1], touches
# it every 20 ms, says "held", and keeps it until its stdin closes (or it is killed).
OTHER_HOST = """
import socket, sys, time
from pathlib import Path
real, skew = time.time, float(sys.argv[2])
time.time = lambda: real() + skew
socket.gethostname = lambda: "host-b"
from farm import lease
lease.REFRESH = 0.02
held = lease.acquire(Path(sys.argv[1]), lease.Owner.this_process("remote", "/jobs/city.yaml"))
held.keep(lambda reason: print("lost", reason, flush=True))
print("held", flush=True)
sys.stdin.read()
held.release()
"""


@pytest.fixture
def path(tmp_path) -> Path:
    (tmp_path / "out").mkdir()  # the output root, which `farm submit` makes before it takes the lease
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


def test_the_lease_of_a_dead_driver_whose_pid_another_process_took_is_taken_over_at_once(path):
    """A driver SIGKILLed (or its container restarted, which numbers processes from 1 again) whose pid a later
    process took: that process is another one, told apart by its start after the host's boot."""
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as other:
        try:
            killed = _owner("killed", pid=other.pid, process=processes.identity(other.pid).rsplit(":", 1)[0] + ":1")
            lease.acquire(path, killed)  # never released; its pid now names `other`, started later
            assert lease.holder(path) is None
            held = lease.acquire(path, _owner("next"))
            assert lease.read(path).run == "next" and lease.holder(path) == held.owner
            held.release()
            lease.acquire(path, _owner("alive", pid=other.pid, process=processes.identity(other.pid)))
            assert lease.holder(path).run == "alive"  # the same process: alive
        finally:
            other.communicate(b"")


def test_a_lease_from_another_host_is_taken_over_once_untouched_for_stale_seconds_of_the_readers_clock(
        path, monkeypatch):
    monkeypatch.setattr(lease, "STALE", 0.2)
    lease.acquire(path, _owner("remote", host="another-host", pid=1))  # its driver lost its node: no more touches
    told: list[str] = []
    taken = lease.acquire(path, _owner("here"), on_wait=lambda holder, why: told.append(why), poll=0.01)
    assert taken.owner.run == "here" and lease.read(path).run == "here"
    assert "host another-host is not this one: watching its lease for a touch" in told[0]


@pytest.fixture
def other_host(path):
    """Starts a holder on "another host" with its clock skewed by the given seconds; kills it at the end."""
    started: list[subprocess.Popen] = []

    def start(skew: float) -> subprocess.Popen:
        holder = subprocess.Popen([sys.executable, "-c", OTHER_HOST, str(path), str(skew)], cwd=ROOT, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        started.append(holder)
        assert select.select([holder.stdout], [], [], 60)[0], "the holder did not take the lease within 60 s"
        assert holder.stdout.readline() == "held\n"
        return holder

    yield start
    for holder in started:
        holder.kill()
        holder.wait(60)
        holder.stdout.close()


SKEWS = [(-600.0, 0.0), (0.0, 600.0), (600.0, 0.0), (0.0, -600.0)]  # (holder, reader): ten minutes either way


@pytest.mark.parametrize(("holder_skew", "reader_skew"), SKEWS)
def test_a_live_holder_on_a_host_with_a_skewed_clock_is_never_taken_over(path, other_host, monkeypatch,
                                                                         holder_skew, reader_skew):
    holder = other_host(holder_skew)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + reader_skew)
    with pytest.raises(lease.LeaseHeld, match="being rendered by run remote .* on host-b"):
        lease.acquire(path, _owner("here"), poll=0.01)
    holder.stdin.close()  # releases
    assert holder.wait(60) == 0 and not path.exists()
    assert holder.stdout.read() == ""  # it never lost its lease


@pytest.mark.parametrize(("holder_skew", "reader_skew"), SKEWS)
def test_a_dead_holder_on_a_host_with_a_skewed_clock_is_taken_over(path, other_host, monkeypatch,
                                                                   holder_skew, reader_skew):
    holder = other_host(holder_skew)
    holder.send_signal(signal.SIGKILL)
    holder.wait(60)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + reader_skew)
    monkeypatch.setattr(lease, "STALE", 0.3)
    assert lease.acquire(path, _owner("here"), poll=0.01).owner.run == "here"
    assert lease.read(path).run == "here"


def test_the_glance_of_farm_status_takes_a_long_untouched_lease_elsewhere_for_dead(path):
    lease.acquire(path, _owner("remote", host="another-host", pid=1))
    assert lease.holder(path).run == "remote"
    old = time.time() - lease.STALE - 1
    os.utime(path, (old, old))
    assert lease.holder(path) is None


@pytest.mark.parametrize("text", ["{\"host\": ", "[]", "", '{"host": 1, "pid": "7", "run": "r", "manifest": "m", '
                                  '"started": 0}'])
def test_a_garbled_lease_is_reported_naming_the_file_and_the_fix(path, text):
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(lease.LeaseDamaged, match=rf"{path} is not a lease the farm wrote \(.+\); if no `farm submit` "
                                                 rf"of city into .*out is running .* delete the file and submit again"):
        lease.acquire(path, _owner("here"), poll=0.01)
    assert path.read_text() == text  # left for the user to look at


def test_submit_of_a_manifest_with_a_garbled_lease_says_so_at_once(tmp_path, capsys):
    manifest = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    garbled = tmp_path / "out" / ".farm" / "test" / lease.LEASE_FILE
    garbled.parent.mkdir(parents=True)
    garbled.write_text("{")

    assert cli.main(["submit", str(manifest), "--no-progress"]) == 1
    assert f"{garbled} is not a lease the farm wrote (JSONDecodeError" in capsys.readouterr().err


def test_a_takeover_that_finds_the_lease_already_replaced_puts_it_back(path):
    lease.acquire(path, _owner("stale", pid=_dead_pid()))
    judged = lease.look(path)
    path.unlink()
    lease.acquire(path, _owner("winner"))  # another driver took the stale lease over first
    lease._take_over(path, judged)  # this one had judged the old lease stale
    assert lease.read(path).run == "winner" and [p.name for p in path.parent.iterdir()] == [path.name]


def test_wait_waits_for_the_holder_to_release(path):
    held = lease.acquire(path, _owner("first"))
    waiting, result = threading.Event(), {}

    def second() -> None:
        result["lease"] = lease.acquire(path, _owner("second"), wait=True, on_wait=lambda holder, why: waiting.set(),
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
    first = lease.look(path).beat
    held.keep(lambda reason: None)
    deadline = time.monotonic() + 30
    while lease.look(path).beat == first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.look(path).beat != first
    held.release()
