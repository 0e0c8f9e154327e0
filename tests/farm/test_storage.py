"""Atomic publish, sidecars as commit markers, done checks and temp sweeping (no Ray needed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from farm import manifest, storage
from farm.errors import StorageFault
from tests.farm.helpers import output_files, publish, write_manifest

RUN = "run-1"


@pytest.fixture
def job(tmp_path) -> manifest.Job:
    return manifest.load(write_manifest(tmp_path, [{"id": "clip", "prompt": "a red circle"}])).jobs[0]


def test_publish_renames_into_place_and_reports_the_sha256(tmp_path, job):
    digest, size = storage.publish(Path(job.media), 1, lambda temp: temp.write_bytes(b"frames"))
    assert Path(job.media).read_bytes() == b"frames"
    assert (digest, size) == (hashlib.sha256(b"frames").hexdigest(), 6)
    assert output_files(tmp_path / "out") == ["test/clip_s0.mp4"]


def test_a_failing_writer_leaves_nothing_behind(tmp_path, job):
    def crash(temp: Path) -> None:
        temp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        storage.publish(Path(job.media), 1, crash)
    assert output_files(tmp_path / "out") == []


def test_a_job_is_done_only_with_a_matching_sidecar_and_media(job):
    assert storage.check_published(job.media, job.config_hash) == "no sidecar"
    storage.publish(Path(job.media), 1, lambda temp: temp.write_bytes(b"media without sidecar"))
    assert not storage.is_done(job)

    publish(job, run=RUN)
    assert storage.is_done(job)

    Path(job.media).write_bytes(b"replaced by something else")
    assert storage.check_published(job.media, job.config_hash) == "media does not match its sidecar"


def test_a_sidecar_for_another_config_is_not_done(job):
    publish(job, run=RUN)
    assert storage.check_published(job.media, "another config hash") == "sidecar records another config"


def test_only_the_awaited_attempt_counts_as_published(job):
    publish(job, run="earlier-run", attempt=1)
    assert storage.is_done(job)
    assert "not" in storage.check_published(job.media, job.config_hash, (RUN, 1))
    publish(job, run=RUN, attempt=2)
    assert storage.check_published(job.media, job.config_hash, (RUN, 2)) is None
    assert storage.check_published(job.media, job.config_hash, (RUN, 1)) is not None


def test_sidecar_records_job_config_attempt_and_media(job):
    publish(job, run=RUN, attempt=3)
    record = json.loads(storage.sidecar_path(job.media).read_text())
    assert (record["key"], record["config_hash"], record["attempt"], record["run"]) == ("clip", job.config_hash, 3, RUN)
    assert record["media"] == {"file": "clip_s0.mp4", "sha256": hashlib.sha256(b"video bytes").hexdigest(), "bytes": 11}
    assert record["job"]["request"]["prompt"] == "a red circle"


def test_discard_temps_removes_only_this_jobs_leftovers(tmp_path, job):
    folder = Path(job.media).parent
    folder.mkdir(parents=True)
    leftovers = [folder / ".clip_s0.mp4.a1.123.tmp", folder / ".clip_s0.mp4.json.a2.456.tmp"]
    others = [folder / ".other_s0.mp4.a1.123.tmp", folder / "clip_s0.mp4"]
    for path in leftovers + others:
        path.write_bytes(b"x")

    assert storage.discard_temps(job) == 2
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in others)


def test_a_missing_root_is_made_at_submit_start_in_the_nearest_folder_that_exists(tmp_path):
    root = tmp_path / "renders" / "demo"
    storage.check_root(root)  # nothing made by the check
    assert not (tmp_path / "renders").exists()
    storage.prepare_root(root)
    assert (root / ".farm").is_dir()


def test_a_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("not a folder")
    with pytest.raises(StorageFault, match=r"output root .*/out/city: .*/out is not a directory"):
        storage.check_root(tmp_path / "out" / "city")


def test_a_record_with_an_infinity_is_refused_not_written_as_json_that_readers_reject(tmp_path):
    """Python's json writes `Infinity` by default, which strict readers (jq, JavaScript) reject."""
    record = tmp_path / "a.png.json"
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        storage.write_json(record, {"timeout": float("inf")})
    assert not record.exists() and not list(tmp_path.iterdir())
