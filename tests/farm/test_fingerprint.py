"""The checkpoint fingerprint inside every config hash: the content of what the loader reads, hashed once per file
version (issue 49, defects 4 and 15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm import fingerprint, manifest, storage
from farm.errors import ManifestError, StorageFault
from tests.farm.helpers import make_checkpoint, write_manifest

SHARD = Path("transformer") / "diffusion_pytorch_model.safetensors"


@pytest.fixture
def count_hashes(monkeypatch) -> list[str]:
    """The files whose bytes the fingerprint reads, in order."""
    read: list[str] = []
    real = fingerprint._file_hash

    def file_hash(path: Path) -> str:
        read.append(path.name)
        return real(path)

    monkeypatch.setattr(fingerprint, "_file_hash", file_hash)
    return read


def _scale_one_tensor_in_place(shard: Path) -> None:
    """Doubles the first bf16 value of the shard's data (1.0 -> 2.0): same size, same header."""
    data = bytearray(shard.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # safetensors: u64 header length, header, data
    assert data[start:start + 2] == bytes.fromhex("803f")  # bf16 1.0
    data[start:start + 2] = bytes.fromhex("0040")  # bf16 2.0
    with open(shard, "r+b") as handle:  # in place: same inode and size
        handle.write(data)


def test_a_tensor_scaled_in_place_is_another_model(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    before = fingerprint.checkpoint(root)
    size = (root / SHARD).stat().st_size
    _scale_one_tensor_in_place(root / SHARD)
    assert (root / SHARD).stat().st_size == size
    assert fingerprint.checkpoint(root) != before


def test_the_same_files_elsewhere_are_the_same_model_and_configs_count(tmp_path):
    first, second = make_checkpoint(tmp_path / "a"), make_checkpoint(tmp_path / "b")
    assert fingerprint.checkpoint(first) == fingerprint.checkpoint(second)
    make_checkpoint(second, static_fp8=True)
    assert fingerprint.checkpoint(first) != fingerprint.checkpoint(second)


def test_records_and_notes_under_the_checkpoint_folder_do_not_count(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    before = fingerprint.checkpoint(root)
    (root / "out" / ".farm" / "test").mkdir(parents=True)
    (root / "out" / ".farm" / "test" / "state.json").write_text("{}")
    (root / "out" / "clip.mp4.json").write_text("{}")
    (root / "notes.json").write_text('{"who": "me"}')
    assert fingerprint.checkpoint(root) == before


def test_weights_are_hashed_once_per_version_of_their_bytes(tmp_path, count_hashes):
    root = make_checkpoint(tmp_path / "ckpt")
    fingerprint.checkpoint(root)
    assert SHARD.name in count_hashes
    count_hashes.clear()
    fingerprint.checkpoint(root)
    assert count_hashes == []  # every file from the cache
    _scale_one_tensor_in_place(root / SHARD)
    fingerprint.checkpoint(root)
    assert count_hashes == [SHARD.name]  # only the file that changed


def test_a_checkpoint_that_cannot_be_written_caches_in_the_users_cache(tmp_path, monkeypatch, count_hashes):
    root = make_checkpoint(tmp_path / "ckpt")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real = storage.write_json

    def read_only(final: Path, data, root_=None):
        if final.is_relative_to(root):
            raise StorageFault(f"EROFS (Read-only file system) writing {final}")
        return real(final, data, root_)

    monkeypatch.setattr(storage, "write_json", read_only)
    first = fingerprint.checkpoint(root)
    assert not (root / fingerprint.CACHE_FILE).exists()
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1
    count_hashes.clear()
    assert fingerprint.checkpoint(root) == first and count_hashes == []


def test_a_damaged_cache_costs_only_a_rehash(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    first = fingerprint.checkpoint(root)
    (root / fingerprint.CACHE_FILE).write_text('{"format": 1, "files": [')
    assert fingerprint.checkpoint(root) == first
    assert json.loads((root / fingerprint.CACHE_FILE).read_text())["format"] == fingerprint.CACHE_FORMAT


def test_an_output_root_inside_the_checkpoint_is_refused(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], output={"root": "ckpt/renders"})
    with pytest.raises(ManifestError, match=r"output -> root: .*ckpt/renders is inside the checkpoint"):
        manifest.load(path)
