"""The farm's own records under `.farm/`: read defensively, appended whole, written however a run ends (issue 49,
defects 7 and 17, and the publish that finishes after Ctrl-C)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm import cli, driver, lease, manifest, storage
from farm.errors import StorageFault
from farm.events import RunLog
from farm.job import JobState
from farm.metrics import RunMetrics
from farm.scheduler import Attempt, Scheduler, Settings, Slot
from tests.farm.helpers import publish, state, write_manifest

REPO = Path(__file__).parents[2]

DAMAGED_STATES = [
    pytest.param("[1, 2, 3]", id="a list"),
    pytest.param('{"jobs": {"a": {"state": "done"}}}', id="an entry without media"),
    pytest.param('{"jobs": [1]}', id="jobs as a list"),
    pytest.param('{"jobs": {"a": ', id="cut short"),
    pytest.param("[" * 100_000 + "]" * 100_000, id="nested deeper than the decoder recurses"),
]


@pytest.mark.parametrize("text", DAMAGED_STATES)
def test_a_damaged_state_never_crashes_status_or_submit_and_submit_leaves_no_lease(tmp_path, capsys, text):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    root = tmp_path / "out"
    publish(manifest.load(path).jobs[0], run="earlier")
    records = root / ".farm" / "test"
    records.mkdir(parents=True)
    (records / "state.json").write_text(text)

    assert cli.main(["status", str(root), "--output", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["manifests"][0]
    problem = row.get("damaged") or row["last_run"]
    assert str(records / "state.json") in problem and "farm submit" in problem

    assert cli.main(["submit", str(path), "--no-progress"]) == 0  # all done: no cluster needed
    assert not (records / lease.LEASE_FILE).exists()
    assert state(root)["jobs"]["a"]["state"] == "done"  # written again whole


def test_a_state_removed_after_the_listing_is_left_out_not_a_crash(tmp_path, monkeypatch):
    records = tmp_path / ".farm"
    for name in ("kept", "removed"):
        (records / name).mkdir(parents=True)
        (records / name / "state.json").write_text('{"jobs": {}}')
    listed = sorted(records.glob("*/state.json"))
    (records / "removed" / "state.json").unlink()  # by a `farm submit` rewriting it, or by hand
    monkeypatch.setattr(storage.Path, "glob", lambda self, pattern: iter(listed))
    assert storage.read_states(tmp_path) == {"kept": {"jobs": {}}}
    assert storage.read_state(tmp_path, "removed") is None


def test_a_submit_that_crashes_after_taking_the_lease_gives_it_back(tmp_path, monkeypatch):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])

    def crash(m):
        raise RuntimeError("a bug")

    monkeypatch.setattr(driver.claims, "claim", crash)
    with pytest.raises(RuntimeError):
        driver.submit(manifest.load(path), driver.SubmitOptions(progress=False))
    assert not (tmp_path / "out" / ".farm" / "test" / lease.LEASE_FILE).exists()


# -- a full disk --------------------------------------------------------------------------------------


def _failing_writes(monkeypatch, fails) -> None:
    """os.write into the event log writes half the line, then fails with ENOSPC, while `fails(data)`."""
    real = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("events.jsonl") and fails(bytes(data)):
            real(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_an_event_is_appended_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    log = RunLog(path, "run-1", 3, progress=False)
    log.emit("run_started")
    _failing_writes(monkeypatch, lambda data: b"job_failed" in data)
    log.emit("job_failed", key="a", error="x" * 1000)
    monkeypatch.undo()
    log.emit("job_done", key="b")
    log.close()

    lines = path.read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["run_started", "job_done"]
    assert log.fault.startswith("ENOSPC (No space left on device) appending to ")


def test_an_event_with_a_non_finite_figure_is_written_as_strict_json(tmp_path):
    path = tmp_path / "events.jsonl"
    log = RunLog(path, "run-1", 1, progress=False)
    log.emit("job_done", key="a", seconds=float("nan"), figures={"eta": float("inf"), "steps": (1.5, float("-inf"))})
    log.close()

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    record = json.loads(path.read_text(), parse_constant=refuse)
    assert (record["event"], record["key"], record["seconds"]) == ("job_done", "a", None)
    assert record["figures"] == {"eta": None, "steps": [1.5, None]}


def test_a_summary_that_cannot_be_written_still_leaves_the_state_and_says_so(tmp_path, monkeypatch):
    m = manifest.load(write_manifest(tmp_path, [{"id": "a", "prompt": "x"}]))
    storage.prepare_root(m.output_root)
    report = driver.RunReport("run-1", m, {}, [])
    real = storage.write_json

    def full(final: Path, data, root=None):
        if "runs" in final.parts:
            raise StorageFault(f"ENOSPC (No space left on device) writing {final}")
        return real(final, data, root)

    monkeypatch.setattr(storage, "write_json", full)
    driver._record(report)
    assert "not recorded: the run summary (ENOSPC" in report.error
    assert state(tmp_path / "out")["run"] == "run-1" and report.summary_path is None


# -- a publish that finishes as the run stops ---------------------------------------------------------


def test_a_publish_finished_when_the_run_stops_is_logged_done(tmp_path, monkeypatch):
    m = manifest.load(write_manifest(tmp_path, [{"id": "late", "prompt": "x"}, {"id": "cut", "prompt": "y"}]))
    late, cut = m.jobs
    log = RunLog(tmp_path / "events.jsonl", "run-1", 2, progress=False)
    scheduler = Scheduler([late, cut], launch=None, workers=1, settings=Settings(None), log=log,
                          metrics=RunMetrics("test", 2))
    monkeypatch.setattr(scheduler, "_kill", lambda slots, running=(): None)  # no actors in this test
    slot = Slot(0)
    scheduler.inflight = {"late-ref": Attempt(late, slot, 1, 0.0, 1e9, publishing=True),
                          "cut-ref": Attempt(cut, slot, 1, 0.0, 1e9, publishing=True)}
    publish(late, run="run-1", attempt=1)  # its worker published it between Ctrl-C and the kill
    Path(cut.media).parent.mkdir(parents=True, exist_ok=True)
    leftover = storage.temp_path(Path(cut.media))
    leftover.write_bytes(b"half")  # this one was cut off mid-write

    scheduler._stop_workers()
    log.close()
    done = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["key"]) for e in done] == [("job_done", "late")]
    assert scheduler.outcomes["late"].state is JobState.DONE and scheduler.outcomes["cut"].state is JobState.PENDING
    assert not leftover.exists()


def test_a_record_that_is_a_fifo_is_reported_never_waited_on(tmp_path):
    """Someone who can write the root can leave a FIFO (or a link to /dev/zero) where a record goes: reading it
    would block (or never end). Each command runs as a child with a timeout, so a hang fails the test."""
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    root = tmp_path / "out"
    publish(manifest.load(path).jobs[0], run="earlier")
    records = root / ".farm" / "test"
    records.mkdir(parents=True)
    os.mkfifo(records / "state.json")

    def farm(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "farm", *args], cwd=REPO, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=120)

    status = farm("status", str(root))
    assert status.returncode == 0 and f"{records / 'state.json'} cannot be read" in status.stdout, status
    assert farm("submit", str(path), "--no-progress").returncode == 0  # all done: no cluster needed
    assert state(root)["jobs"]["a"]["state"] == "done"  # written again whole, a regular file

    os.mkfifo(records / lease.LEASE_FILE)
    refused = farm("submit", str(path), "--no-progress")
    assert refused.returncode == 1 and str(records / lease.LEASE_FILE) in refused.stderr, refused


@pytest.mark.parametrize("damaged", ["first", "second"])
def test_status_keeps_a_damaged_states_note_whichever_row_it_is(tmp_path, capsys, damaged):
    entry = {"media": str(tmp_path / "x.mp4"), "config_hash": "h", "state": "pending"}
    for name in ("first", "second"):
        jobs = {"a": entry, **({"b": {"state": "done"}} if name == damaged else {})}  # b: no media, left out
        (tmp_path / ".farm" / name).mkdir(parents=True)
        (tmp_path / ".farm" / name / "state.json").write_text(json.dumps({"run": "r", "result": "complete",
                                                                          "jobs": jobs}))
    assert cli.main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    note = f"{damaged}: {tmp_path / '.farm' / damaged / 'state.json'} has 1 job entries that are not mappings"
    assert note in out and out.count("has 1 job entries") == 1
    assert cli.main(["status", str(tmp_path), "--output", "json"]) == 0
    rows = {row["manifest"]: row for row in json.loads(capsys.readouterr().out)["manifests"]}
    assert [name for name, row in rows.items() if "damaged" in row] == [damaged]


NESTED = "[" * 100_000 + "]" * 100_000  # 200 kB: inside every size bound, deeper than Python's decoder recurses


def test_a_sidecar_claims_or_lease_nested_too_deep_is_damaged_not_a_traceback(tmp_path, capsys):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    job = manifest.load(path).jobs[0]
    publish(job, run="earlier")
    assert cli.main(["submit", str(path), "--no-progress"]) == 0  # all done: records, no cluster
    other = write_manifest(tmp_path / "other", [{"id": "b", "prompt": "y"}], name="other",
                           output={"root": str(tmp_path / "out")})
    records = tmp_path / "out" / ".farm" / "test"
    capsys.readouterr()

    storage.sidecar_path(job.media).write_text(NESTED)
    assert cli.main(["plan", str(path)]) == 0 and "todo" in capsys.readouterr().out  # not done: rendered again
    (records / "claims.json").write_text(NESTED)
    assert cli.main(["validate", str(other)]) == 0  # the state stands in for the claims
    (records / "state.json").write_text(NESTED)
    assert cli.main(["validate", str(other)]) == 1
    assert "nested too deeply to be decoded" in capsys.readouterr().err
    (records / lease.LEASE_FILE).write_text(NESTED)
    assert cli.main(["submit", str(path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert str(records / lease.LEASE_FILE) in err and "Traceback" not in err
