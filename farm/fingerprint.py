"""A checkpoint's identity for "the same model": what decides the pixels, read from the files the loader reads.

The fingerprint covers the checkpoint's components (`cosmos3.rules.checkpoint_header.COMPONENTS` and the sound
tokenizer), every file directly in each by content: configs, tokenizer files, safetensors indexes and the
weights themselves, so a fine-tune that scales one tensor in place is another model. Nothing else under the
checkpoint folder counts (notes, renders, a copy of the farm's records). Paths are relative, so a moved copy
keeps its identity.

Hashing 16 GB of weights takes a minute, so each file's sha256 is cached, keyed by what changes when its bytes
can have changed (size, mtime and ctime in ns, inode, device): in `.farm-fingerprint.json` in the checkpoint's
root, or, where that cannot be written (a read-only share), in the user's cache folder. A cache that is
missing, damaged or stale only costs a rehash.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cosmos3.rules.checkpoint_header import COMPONENTS
from cosmos3.rules.config import SOUND_TOKENIZER_DIR
from farm import storage
from farm.errors import StorageFault

CACHE_FILE = ".farm-fingerprint.json"
CACHE_FORMAT = 1
_COMPONENTS = (*COMPONENTS, SOUND_TOKENIZER_DIR)


def checkpoint(root: Path) -> str:
    """The fingerprint of the checkpoint at `root` (absolute)."""
    cache, cache_path = _read_cache(root)
    digest, fresh = hashlib.sha256(), {}
    for path in _defining_files(root):
        rel = path.relative_to(root).as_posix()
        info = os.stat(path)
        key = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev]
        known = cache.get(rel)
        if isinstance(known, dict) and known.get("key") == key and isinstance(known.get("sha256"), str):
            file_hash = known["sha256"]
        else:
            file_hash = _file_hash(path)
        fresh[rel] = {"key": key, "sha256": file_hash}
        digest.update(f"{rel}\0{file_hash}\0".encode())
    if fresh != cache:
        _write_cache(root, cache_path, fresh)
    return digest.hexdigest()


def _file_hash(path: Path) -> str:
    with open(path, "rb") as handle:  # a checkpoint's files may be links (a hub cache's snapshots)
        return storage.hash_handle(handle)[0]


def _defining_files(root: Path) -> list[Path]:
    """The regular files of each component (a file, or a folder's files, hidden ones aside), in a fixed order."""
    files = []
    for name in _COMPONENTS:
        path = root / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
    return sorted(files)


def _user_cache(root: Path) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cosmos3-farm" / "fingerprints" / f"{hashlib.sha256(str(root).encode()).hexdigest()}.json"


def _read_cache(root: Path) -> tuple[dict, Path | None]:
    """The cached hashes by relative path, and the cache they came from (None: none yet)."""
    for path in (root / CACHE_FILE, _user_cache(root)):
        record, _ = storage.read_record(path)
        if record is not None and record.get("format") == CACHE_FORMAT and isinstance(record.get("files"), dict):
            return record["files"], path
    return {}, None


def _write_cache(root: Path, known: Path | None, files: dict) -> None:
    data = {"format": CACHE_FORMAT, "files": files}
    for path in dict.fromkeys([known, root / CACHE_FILE, _user_cache(root)]):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            storage.write_json(path, data)
            return
        except (OSError, StorageFault):  # read-only: try the next place; with none, hash again next time
            continue
