"""The checkpoint fingerprint inside every config hash and every sidecar: the content of what the loader reads,
hashed once per file version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosmos3.rules import checkpoint_identity
from farm import manifest
from farm.errors import ManifestError
from tests.farm.helpers import make_checkpoint, scale_one_tensor_in_place, write_manifest

SHARD = Path("transformer") / "diffusion_pytorch_model.safetensors"


def _fingerprint(root: Path) -> str:
    return checkpoint_identity.fingerprint(root).sha256


@pytest.fixture
def count_hashes(monkeypatch) -> list[str]:
    """The files whose bytes the fingerprint reads, in order."""
    read: list[str] = []
    real = checkpoint_identity._hash

    def file_hash(handle) -> str:
        read.append(Path(handle.name).name)
        return real(handle)

    monkeypatch.setattr(checkpoint_identity, "_hash", file_hash)
    return read


def test_a_tensor_scaled_in_place_is_another_model(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    before = _fingerprint(root)
    size = (root / SHARD).stat().st_size
    scale_one_tensor_in_place(root / SHARD)
    assert (root / SHARD).stat().st_size == size
    assert _fingerprint(root) != before


def test_the_same_files_elsewhere_are_the_same_model_and_configs_count(tmp_path):
    first, second = make_checkpoint(tmp_path / "a"), make_checkpoint(tmp_path / "b")
    assert _fingerprint(first) == _fingerprint(second)
    make_checkpoint(second, static_fp8=True)
    assert _fingerprint(first) != _fingerprint(second)


def test_records_and_notes_under_the_checkpoint_folder_do_not_count(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    before = _fingerprint(root)
    (root / "out" / ".farm" / "test").mkdir(parents=True)
    (root / "out" / ".farm" / "test" / "state.json").write_text("{}")
    (root / "out" / "clip.mp4.json").write_text("{}")
    (root / "notes.json").write_text('{"who": "me"}')
    assert _fingerprint(root) == before


def test_weights_are_hashed_once_per_version_of_their_bytes(tmp_path, count_hashes):
    root = make_checkpoint(tmp_path / "ckpt")
    _fingerprint(root)
    assert SHARD.name in count_hashes
    count_hashes.clear()
    _fingerprint(root)
    assert count_hashes == []  # every file from the cache
    scale_one_tensor_in_place(root / SHARD)
    _fingerprint(root)
    assert count_hashes == [SHARD.name]  # only the file that changed


def test_a_checkpoint_that_cannot_be_written_caches_in_the_users_cache(tmp_path, monkeypatch, count_hashes):
    root = make_checkpoint(tmp_path / "ckpt")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real = checkpoint_identity.tempfile.mkstemp

    def read_only(dir, prefix):  # noqa: A002 (tempfile's own argument name)
        if Path(dir).is_relative_to(root):
            raise OSError(30, "Read-only file system")
        return real(dir=dir, prefix=prefix)

    monkeypatch.setattr(checkpoint_identity.tempfile, "mkstemp", read_only)
    first = _fingerprint(root)
    assert not (root / checkpoint_identity.CACHE_FILE).exists()
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1
    count_hashes.clear()
    assert _fingerprint(root) == first and count_hashes == []


def test_a_damaged_cache_costs_only_a_rehash(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    first = _fingerprint(root)
    (root / checkpoint_identity.CACHE_FILE).write_text('{"format": 1, "files": [')
    assert _fingerprint(root) == first
    assert json.loads((root / checkpoint_identity.CACHE_FILE).read_text())["format"] == checkpoint_identity.CACHE_FORMAT


def test_an_output_root_inside_the_checkpoint_is_refused(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], output={"root": "ckpt/renders"})
    with pytest.raises(ManifestError, match=r"output -> root: .*ckpt/renders is inside the checkpoint"):
        manifest.load(path)
