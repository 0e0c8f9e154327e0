"""The records under `ROOT/.farm/` cannot be redirected out of the root, hang the farm, exhaust its memory or crash it:
whatever a co-tenant of the storage plants there is refused with a message naming the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm import cli, lease, manifest, records, storage
from tests.farm.helpers import publish, write_manifest

REPO = Path(__file__).parents[2]
THREE_GB = 3 << 30


def _manifest(tmp_path: Path, *, done: bool) -> Path:
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    (tmp_path / "out").mkdir()
    if done:  # submit then needs no cluster: it checks, claims and records
        publish(manifest.load(path).jobs[0], run="earlier")
    return path


def _run(capsys, *args: str) -> tuple[int, str]:
    code = cli.main([*args, "--no-progress"] if args[0] in ("submit", "retry") else list(args))
    out, err = capsys.readouterr()
    return code, out + err


def _plant(where: Path, what: str, outside: Path) -> None:
    """A link to `outside`, a folder, a file or a FIFO at `where`."""
    where.parent.mkdir(parents=True, exist_ok=True)
    if what == "link":
        where.symlink_to(outside)
    elif what == "folder":
        where.mkdir()
    elif what == "file":
        where.write_text("planted")
    else:
        os.mkfifo(where)


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "runs").mkdir()
    return outside


# Where a link sends the records out of the root; each is refused with its path, nothing written there.
@pytest.mark.parametrize("where", [".farm", ".farm/test", ".farm/test/runs"])
def test_a_link_on_the_way_to_a_record_is_never_followed(tmp_path, capsys, where):
    path = _manifest(tmp_path, done=True)
    outside = _outside(tmp_path)
    _plant(tmp_path / "out" / where, "link", outside if where != ".farm/test/runs" else outside / "runs")
    code, printed = _run(capsys, "submit", str(path))
    assert code == 1 and "Traceback" not in printed
    assert f"{tmp_path / 'out' / '.farm'}" in printed and "link" in printed
    assert sorted(p.name for p in outside.rglob("*")) == ["runs"]  # nothing written through it
    assert _run(capsys, "status", str(tmp_path / "out"))[0] == 1 or where == ".farm/test/runs"


@pytest.mark.parametrize("record, what", [
    ("events.jsonl", "fifo"), ("events.jsonl", "link"), ("events.jsonl", "folder"),
    ("state.json", "folder"), ("lease.json", "fifo"), ("lease.json", "folder"),
])
def test_a_record_that_is_not_a_file_stops_submit_with_its_path_before_a_cluster_starts(tmp_path, record, what):
    path = _manifest(tmp_path, done=False)
    outside = _outside(tmp_path)
    _plant(tmp_path / "out" / ".farm" / "test" / record, what, outside / record)
    # A child, so that a FIFO that blocked would fail the test by its timeout instead of hanging it.
    done = subprocess.run([sys.executable, "-m", "farm", "submit", str(path), "--no-progress", "--pipeline",
                           "worker.fake:factory"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(tmp_path / "out" / ".farm" / "test" / record) in done.stderr
    assert "dashboard" not in done.stderr  # refused before the run started a cluster
    assert list(outside.rglob("*")) == [outside / "runs"]


@pytest.mark.parametrize("where", [".farm", ".farm/test", ".farm/.claims.lock"])
@pytest.mark.parametrize("what", ["file", "fifo", "link"])
def test_a_planted_records_folder_or_lock_is_refused_with_its_path(tmp_path, capsys, where, what):
    if where == ".farm/.claims.lock" and what == "file":
        return  # a file is what the lock is
    path = _manifest(tmp_path, done=True)
    outside = _outside(tmp_path)
    _plant(tmp_path / "out" / where, what, outside)
    # validate reads `.farm` (other manifests' claims), not its own records; only submit takes the lock.
    commands = {".farm": ("validate", "submit", "retry"), ".farm/test": ("submit", "retry")}.get(where, ("submit",))
    for command in commands:
        code, printed = _run(capsys, command, str(path))
        assert "Traceback" not in printed
        assert code == 1 and str(tmp_path / "out" / where) in printed, (command, printed)
    assert list(outside.rglob("*")) == [outside / "runs"]


@pytest.mark.parametrize("record", ["state.json", "claims.json"])
def test_a_huge_sparse_record_is_refused_by_its_size_not_read(tmp_path, capsys, record):
    path = _manifest(tmp_path, done=True)
    other = tmp_path / "out" / ".farm" / "other"  # another manifest's records: claims fail closed on them
    other.mkdir(parents=True)
    with open(other / record, "wb") as handle:
        handle.truncate(THREE_GB)  # a hole: no disk, and 3 GB to read
    found, problem = records.read(tmp_path / "out", "other", record)
    assert found is None and f"{THREE_GB:,} bytes, more than" in problem
    code, printed = _run(capsys, "status", str(tmp_path / "out"))
    assert "Traceback" not in printed and (record == "claims.json" or f"{THREE_GB:,} bytes" in printed)
    code, printed = _run(capsys, "validate", str(path))
    assert code == 1 and f"{THREE_GB:,} bytes, more than" in printed  # the other's files unknown: refused


def test_a_huge_sparse_sidecar_is_not_read_and_the_job_is_not_done(tmp_path):
    job = manifest.load(_manifest(tmp_path, done=True)).jobs[0]
    with open(storage.sidecar_path(job.media), "wb") as handle:
        handle.truncate(THREE_GB)
    assert storage.check_published(job.files, job.config_hash) == "no sidecar"


def _lease(tmp_path: Path, **fields) -> None:
    data = {"host": os.uname().nodename, "pid": os.getpid(), "run": "r", "manifest": "/m.yaml", "started": 1.0,
            **fields}
    where = tmp_path / "out" / ".farm" / "test" / lease.LEASE_FILE
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(data))  # Python writes NaN and Infinity; a hand edit can too


@pytest.mark.parametrize("fields", [{"started": 1e308}, {"started": float("nan")}, {"started": -1e308},
                                    {"pid": 10**20}, {"pid": 0}, {"pid": -1}, {"pid": 2**31}],
                         ids=["started-1e308", "started-nan", "started-negative", "pid-1e20", "pid-0", "pid--1",
                              "pid-2**31"])
def test_a_lease_with_values_out_of_range_is_no_live_driver_and_crashes_nothing(tmp_path, capsys, fields):
    path = _manifest(tmp_path, done=True)
    records.write(tmp_path / "out", "test", records.STATE_FILE,
                  data={"run": "r", "result": "running", "jobs": {}})  # a run whose driver may be gone
    _lease(tmp_path, **fields)
    code, printed = _run(capsys, "status", str(tmp_path / "out"))
    assert code == 0 and "interrupted: its driver is gone" in printed  # pid 0 and -1 are no driver
    for command in ("submit", "retry"):
        code, printed = _run(capsys, command, str(path))
        assert "Traceback" not in printed and "is being rendered by" not in printed
    code, printed = _run(capsys, "submit", str(path))
    assert code == 1 and "is not a lease the farm wrote" in printed and lease.LEASE_FILE in printed


@pytest.mark.parametrize("entry", [
    {"media": "/x\u0000y.mp4", "config_hash": "h"}, {"media": "relative.mp4", "config_hash": "h"},
    {"media": "/" + "a" * 5000, "config_hash": "h"}, {"media": "/x.mp4", "files": ["/y\u0000"], "config_hash": "h"},
    {"media": "/x.mp4", "config_hash": "h", "attempts": 10**30}, {"media": "/x.mp4", "config_hash": "h", "state": 7},
    {"media": "/x.mp4", "config_hash": "h", "error": ["a"]},
], ids=["nul", "relative", "past-path-max", "nul-in-files", "attempts-10**30", "state-number", "error-list"])
def test_a_state_entry_out_of_range_is_left_out_with_a_note(tmp_path, capsys, entry):
    path = _manifest(tmp_path, done=True)
    where = tmp_path / "out" / ".farm" / "test" / records.STATE_FILE
    where.parent.mkdir(parents=True)
    where.write_text(json.dumps({"run": "r", "result": "complete", "jobs": {"a": entry}}))
    code, printed = _run(capsys, "status", str(tmp_path / "out"))
    assert code == 0 and f"{where} has 1 job entries" in printed
    assert _run(capsys, "submit", str(path))[0] == 0  # written again, whole
    assert records.read_state(tmp_path / "out", "test")["jobs"]["a"]["state"] == "done"


@pytest.mark.parametrize("text", ['{"jobs": {}, "run": NaN}', '{"jobs": {}, "updated": Infinity}'])
def test_a_record_that_is_not_strict_json_is_unreadable_not_written_back(tmp_path, capsys, text):
    path = _manifest(tmp_path, done=True)
    where = tmp_path / "out" / ".farm" / "test" / records.STATE_FILE
    where.parent.mkdir(parents=True)
    where.write_text(text)
    code, printed = _run(capsys, "status", str(tmp_path / "out"))
    assert code == 0 and "is not a JSON number" in printed
    assert _run(capsys, "submit", str(path))[0] == 0
    assert "NaN" not in where.read_text() and "Infinity" not in where.read_text()


def test_a_link_at_a_record_is_replaced_never_written_through(tmp_path, capsys):
    path = _manifest(tmp_path, done=True)
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    folder = tmp_path / "out" / ".farm" / "test"
    folder.mkdir(parents=True)
    (folder / records.STATE_FILE).symlink_to(victim)
    assert _run(capsys, "submit", str(path))[0] == 0
    assert victim.read_text() == "keep me" and not (folder / records.STATE_FILE).is_symlink()
