"""Output paths that cannot be written are refused at validate, before anything renders; a publish that fails
half-way leaves no media without its sidecar (issue 49, defects 5 and 6)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from farm import cli, manifest, storage
from farm.errors import ManifestError, StorageFault
from tests.farm.helpers import write_manifest

LIMIT = 255  # NAME_MAX of the file systems tests run on (ext4, xfs, tmpfs, overlayfs)


@pytest.fixture(autouse=True)
def _limit(tmp_path):
    assert storage.name_max(tmp_path) == LIMIT


def test_a_job_id_too_long_for_the_file_system_is_refused_with_the_limit(tmp_path):
    long_id = "a" * 240  # fits alone, not with `_s0.mp4` and the sidecar's temp suffix
    path = write_manifest(tmp_path, [{"id": long_id, "prompt": "x"}])
    with pytest.raises(ManifestError, match=rf"jobs\[0\].*output path: the file name is \d+ bytes with the farm's "
                                            rf"temp and sidecar suffixes; the file system allows {LIMIT}"):
        manifest.load(path)


def test_a_name_too_long_for_the_records_folder_is_refused_at_validate_and_submit_without_a_traceback(tmp_path,
                                                                                                      capsys):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], name="short", output={"path": "{id}"})
    path.write_text(path.read_text().replace("name: short", f"name: {'n' * 300}"))
    for command in ("validate", "submit"):
        assert cli.main([command, str(path)]) == 1
        err = capsys.readouterr().err
        assert "name: 300 bytes; the farm keeps its records in .farm/<name>/" in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["test/a_s0.mp4", "test/a_s0.mp4.json"], ids=["media", "sidecar"])
def test_a_folder_where_a_file_goes_is_refused_at_validate(tmp_path, where):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    (tmp_path / "out" / where).mkdir(parents=True)
    with pytest.raises(ManifestError, match=rf"output path: .*{where} is a folder; the farm publishes a file there"):
        manifest.load(path)


def test_a_file_where_a_folder_goes_is_refused_at_validate(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "test").write_text("not a folder")
    with pytest.raises(ManifestError, match=r"output path: .*out/test is a file, where a folder of the output must go"):
        manifest.load(path)


def test_a_sidecar_that_cannot_be_published_takes_its_media_back(tmp_path):
    job = manifest.load(write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])).jobs[0]
    root = Path(job.media).parents[1]
    storage.prepare_root(root)
    Path(job.media).parent.mkdir()
    with pytest.raises(StorageFault, match="EISDIR"):
        with storage.Publication(root) as publication:
            publication.file(Path(job.media), lambda out: out.write(b"video"))
            storage.sidecar_path(job.media).mkdir()  # appears after validate, before the sidecar
            publication.json(storage.sidecar_path(job.media), {"key": "a"})
    assert not Path(job.media).exists() and not storage.is_done(job)


def test_a_media_path_that_fits_name_max_but_not_path_max_with_its_temp_name_is_refused_at_validate(tmp_path):
    root = tmp_path / "out"
    # Folders of 200 bytes, then a file name that brings the media's path to 20 bytes under PATH_MAX: every name
    # fits, the media's path fits, and its sidecar's temp file (`.NAME.json.<16 hex>.tmp`, 27 bytes more) does not.
    media_bytes = storage.path_max() - 20
    folders = "/".join(["d" * 200] * ((media_bytes - len(str(root)) - 150) // 201))
    stem = "x" * (media_bytes - len(f"{root}/{folders}/") - len("_s0.mp4"))
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], output={"path": f"{folders}/{stem}_s{{seed}}"})
    with pytest.raises(ManifestError, match=r"output path: with the farm's temp and sidecar suffixes the path is "
                                            r"[\d,]+ bytes; the system takes paths of at most 4,095 \(PATH_MAX\)"):
        manifest.load(path)


@pytest.mark.parametrize("name, problem", [
    pytest.param("a/" * 2100 + "m.yaml", r"the path is 4,2\d\d bytes; the system takes paths of at most 4,095 "
                                        r"\(PATH_MAX\)", id="over PATH_MAX"),
    pytest.param("m" * 300 + ".yaml", "a name in it is longer than its file system takes", id="over NAME_MAX"),
])
def test_a_manifest_path_too_long_to_open_says_which_limit(tmp_path, capsys, name, problem):
    assert cli.main(["validate", str(tmp_path / name)]) == 1
    err = capsys.readouterr().err
    assert re.search(problem, err) and "Traceback" not in err


def test_a_root_whose_records_would_not_fit_path_max_is_refused_at_validate(tmp_path):
    """The media's path and its temp file fit, the records' longest path (a run summary's temp file,
    `.farm/NAME/runs/.<run id>.json.<16 hex>.tmp`) does not: a run would render and then fail writing its summary."""
    depth = storage.path_max() - 50 - len(str(tmp_path))
    root = tmp_path / "/".join(["d" * 200] * (depth // 201) + ["r" * (depth % 201 or 1)])
    root.mkdir(parents=True)
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], output={"root": str(root), "path": "{id}"})
    assert len(str(storage.temp_path(storage.sidecar_path(root / "a.mp4")))) < storage.path_max()
    with pytest.raises(ManifestError, match=r"output -> root: the farm's records in .*/.farm/test/ would not fit: the "
                                            r"path is [\d,]+ bytes; the system takes paths of at most 4,095"):
        manifest.load(path)
