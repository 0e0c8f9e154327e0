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
    digest, size = storage.publish(Path(job.media), lambda out: out.write(b"frames"))
    assert Path(job.media).read_bytes() == b"frames"
    assert (digest, size) == (hashlib.sha256(b"frames").hexdigest(), 6)
    assert output_files(tmp_path / "out") == ["test/clip_s0.mp4"]


def test_a_failing_writer_leaves_nothing_behind(tmp_path, job):
    def crash(out) -> None:
        out.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        storage.publish(Path(job.media), crash)
    assert output_files(tmp_path / "out") == []


def test_a_job_is_done_only_with_a_matching_sidecar_and_media(job):
    assert storage.check_published(job.files, job.config_hash) == "no sidecar"
    storage.publish(Path(job.media), lambda out: out.write(b"media without sidecar"))
    assert not storage.is_done(job)

    publish(job, run=RUN)
    assert storage.is_done(job)

    Path(job.media).write_bytes(b"replaced by something else")
    assert storage.check_published(job.files, job.config_hash) == "media does not match its sidecar"


def test_a_sidecar_for_another_config_is_not_done(job):
    publish(job, run=RUN)
    assert storage.check_published(job.files, "another config hash") == "sidecar records another config"


def test_only_the_awaited_attempt_counts_as_published(job):
    publish(job, run="earlier-run", attempt=1)
    assert storage.is_done(job)
    assert "not" in storage.check_published(job.files, job.config_hash, (RUN, 1))
    publish(job, run=RUN, attempt=2)
    assert storage.check_published(job.files, job.config_hash, (RUN, 2)) is None
    assert storage.check_published(job.files, job.config_hash, (RUN, 1)) is not None


def test_sidecar_records_job_config_attempt_and_media(job):
    publish(job, run=RUN, attempt=3)
    record = json.loads(storage.sidecar_path(job.media).read_text())
    assert (record["key"], record["config_hash"], record["attempt"], record["run"]) == ("clip", job.config_hash, 3, RUN)
    assert record["media"] == {"file": "clip_s0.mp4", "sha256": hashlib.sha256(b"video bytes").hexdigest(), "bytes": 11}
    assert record["job"]["request"]["prompt"] == "a red circle"


def test_discard_temps_removes_only_this_jobs_leftovers(tmp_path, job):
    folder = Path(job.media).parent
    folder.mkdir(parents=True)
    leftovers = [storage.temp_path(folder / "clip_s0.mp4"), storage.temp_path(folder / "clip_s0.mp4.json")]
    others = [storage.temp_path(folder / "other_s0.mp4"), folder / "clip_s0.mp4"]
    for path in leftovers + others:
        path.write_bytes(b"x")

    assert storage.discard_temps(job) == 2
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in others)


def test_a_missing_root_is_made_at_submit_start_in_the_nearest_folder_that_exists(tmp_path):
    root = tmp_path / "renders" / "demo"
    storage.check_root(root)  # nothing made by the check
    assert not (tmp_path / "renders").exists()
    storage.prepare_root(root)
    assert root.is_dir()


def test_a_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("not a folder")
    with pytest.raises(StorageFault, match=r"output root .*/out/city: .*/out is not a directory"):
        storage.check_root(tmp_path / "out" / "city")


# -- a co-tenant of the share plants links (issue 49, defect 13) -------------------------------------


def test_temp_names_are_unpredictable_and_a_link_planted_at_one_is_never_written_through(tmp_path, job, monkeypatch):
    final = Path(job.media)
    assert storage.temp_path(final) != storage.temp_path(final)
    final.parent.mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"theirs")
    monkeypatch.setattr(storage.secrets, "token_hex", lambda n: "0" * 2 * n)  # the attacker guessed the name
    storage.temp_path(final).symlink_to(outside)
    storage.prepare_root(tmp_path / "out")

    with pytest.raises(StorageFault, match="EEXIST"):
        storage.publish(final, lambda out: out.write(b"frames"), root=tmp_path / "out")
    assert outside.read_bytes() == b"theirs" and not final.exists()


def test_a_temp_swapped_for_a_link_while_written_is_not_published(tmp_path, job):
    final = Path(job.media)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"theirs")

    storage.prepare_root(tmp_path / "out")

    def swap(out) -> None:
        out.write(b"frames")
        Path(out.name).unlink()
        Path(out.name).symlink_to(outside)

    with pytest.raises(StorageFault, match="replaced by another file"):
        storage.publish(final, swap, root=tmp_path / "out")
    assert outside.read_bytes() == b"theirs"
    assert not final.exists() and not final.is_symlink() and output_files(tmp_path / "out") == []


def test_a_link_at_the_final_name_is_replaced_not_written_through(tmp_path, job):
    final = Path(job.media)
    final.parent.mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"theirs")
    final.symlink_to(outside)

    publish(job, run=RUN)
    assert outside.read_bytes() == b"theirs"
    assert not final.is_symlink() and final.read_bytes() == b"video bytes" and storage.is_done(job)


@pytest.mark.parametrize("linked", ["media", "sidecar"])
def test_a_link_is_never_counted_done_even_to_the_right_bytes(tmp_path, job, linked):
    publish(job, run=RUN)
    target = Path(job.media) if linked == "media" else storage.sidecar_path(job.media)
    copy = tmp_path / "copy"
    copy.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(copy)
    assert storage.check_published(job.files, job.config_hash) == (
        "media is not a regular file" if linked == "media" else "no sidecar")


# -- what a job must have comes from the manifest (issue 49, defect 2) ------------------------------


def test_a_wav_the_manifest_asks_for_is_required_even_when_the_sidecar_drops_it(tmp_path):
    clip = {"size": [48, 32], "frames": 9, "fps": 24, "steps": 2}
    m = manifest.load(write_manifest(tmp_path, [{"id": "clip", "prompt": "a", "outputs": ["mp4", "wav"]}],
                                     sound=True, defaults=clip))
    (job,) = m.jobs
    media = storage.publish(Path(job.media), lambda out: out.write(b"video"))
    wav = storage.publish(Path(job.wav), lambda out: out.write(b"RIFF"))
    storage.write_json(storage.sidecar_path(job.media), storage.sidecar_record(job, RUN, 1, media, wav))
    assert storage.is_done(job)

    Path(job.wav).unlink()  # the WAV deleted, and the sidecar edited to no longer list it
    record = json.loads(storage.sidecar_path(job.media).read_text())
    del record["wav"]
    storage.write_json(storage.sidecar_path(job.media), record)
    assert storage.check_published(job.files, job.config_hash) == "wav missing"


def test_a_file_of_the_right_hash_but_another_size_recorded_is_not_done(job):
    publish(job, run=RUN)
    record = json.loads(storage.sidecar_path(job.media).read_text())
    record["media"]["bytes"] += 1
    storage.write_json(storage.sidecar_path(job.media), record)
    assert storage.check_published(job.files, job.config_hash) == "media does not match its sidecar"


# -- temps are matched literally (issue 49, defect 8) -----------------------------------------------


@pytest.mark.parametrize("template", ["k*{id}", "[x]{id}", "?{id}"])
def test_cleaning_a_jobs_temps_never_touches_another_jobs_and_finds_its_own(tmp_path, template):
    m = manifest.load(write_manifest(tmp_path, [{"id": "a", "prompt": "x"}, {"id": "zzz-a", "prompt": "y"}],
                                     output={"path": template}))
    a, other = m.jobs
    Path(a.media).parent.mkdir(parents=True, exist_ok=True)
    mine, theirs = storage.temp_path(Path(a.media)), storage.temp_path(Path(other.media))
    mine.write_bytes(b"stale")
    theirs.write_bytes(b"in flight")

    assert storage.discard_temps(a) == 1
    assert not mine.exists() and theirs.read_bytes() == b"in flight"


def test_a_record_with_an_infinity_is_refused_not_written_as_json_that_readers_reject(tmp_path):
    """Python's json writes `Infinity` by default, which strict readers (jq, JavaScript) reject."""
    record = tmp_path / "a.png.json"
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        storage.write_json(record, {"timeout": float("inf")})
    assert not record.exists() and not list(tmp_path.iterdir())
