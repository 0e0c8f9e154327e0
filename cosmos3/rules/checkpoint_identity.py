"""A checkpoint's identity for "the same model": the fingerprint of the files the pipeline loads.

The fingerprint hashes each file of `checkpoint_header.listed_files` (the one list the loader reads) by its path
relative to the root and its content: a fine-tune that scales one tensor in place is another model, a moved copy the
same one. It is the checkpoint in the farm's config hash and in every sidecar (`identity`), and a worker checks that
the files it loaded are the versions the driver hashed (`changed`).

Hashing 16 GB takes a minute, so each file's sha256 is cached, keyed by what changes when its bytes can have changed
(size, mtime and ctime in ns, inode; not the device number, which nodes sharing one file system may number
differently): in `.farm-fingerprint.json` in the checkpoint's root, or, where that cannot be written (a read-only
share), in the user's cache folder. A cache that is missing, damaged or stale only costs a rehash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cosmos3.errors import CheckpointError
from cosmos3.rules.checkpoint_files import open_file, read_json
from cosmos3.rules.checkpoint_header import listed_files

CACHE_FILE = ".farm-fingerprint.json"
CACHE_FORMAT = 2
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Fingerprint:
    """A checkpoint's fingerprint and, by relative path, the version of each file it hashed:
    ``{"key": [size, mtime_ns, ctime_ns, inode], "sha256": ...}``."""

    sha256: str
    files: dict[str, dict]


def identity(root: str | Path, fingerprint: str) -> dict:
    """What a sidecar records of the checkpoint that rendered it (``checkpoint``): its path and fingerprint."""
    return {"path": str(root), "fingerprint": fingerprint}


def fingerprint(root: Path, known: Mapping[str, dict] | None = None) -> Fingerprint:
    """The fingerprint of the checkpoint at ``root`` (absolute). ``known``: file versions hashed elsewhere (the
    driver's, for a worker), taken for a file whose key is the same here, as the cache's are.

    Raises CheckpointError naming a file that is not a regular one, cannot be read or vanished.
    """
    cache, cache_path = _read_cache(root)
    digest, fresh = hashlib.sha256(), {}
    for path in listed_files(root):
        rel = path.relative_to(root).as_posix()
        with _opened(path) as handle:
            key = _key(os.fstat(handle.fileno()))
            version = next((v for v in ((known or {}).get(rel), cache.get(rel)) if _matches(v, key)), None)
            fresh[rel] = version or {"key": key, "sha256": _hash(handle)}
        digest.update(f"{rel}\0{fresh[rel]['sha256']}\0".encode())
    if fresh != cache:
        _write_cache(root, cache_path, fresh)
    return Fingerprint(digest.hexdigest(), fresh)


def changed(root: Path, since: Fingerprint) -> list[str]:
    """The files of the checkpoint that are not the versions ``since`` hashed, by relative path: added, removed, or
    of another size, times or inode (any write changes a file's ctime). Read by stat alone."""
    now = {}
    for path in listed_files(root):
        with contextlib.suppress(OSError):
            now[path.relative_to(root).as_posix()] = _key(os.stat(path))
    return sorted(rel for rel in now.keys() | since.files.keys()
                  if rel not in since.files or now.get(rel) != since.files[rel]["key"])


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[IO[bytes]]:
    try:
        with open_file(path) as handle:
            yield handle
    except FileNotFoundError:
        raise CheckpointError(f"{path}: part of the checkpoint, but gone (is it being replaced?)") from None


def _key(info: os.stat_result) -> list[int]:
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def _matches(version: Any, key: list[int]) -> bool:
    return isinstance(version, dict) and version.get("key") == key and isinstance(version.get("sha256"), str)


def _hash(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _user_cache(root: Path) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cosmos3-farm" / "fingerprints" / f"{hashlib.sha256(str(root).encode()).hexdigest()}.json"


def _read_cache(root: Path) -> tuple[dict, Path | None]:
    """The cached versions by relative path, and the cache they came from (None: none yet)."""
    for path in (root / CACHE_FILE, _user_cache(root)):
        try:
            record = read_json(path, "missing")
        except CheckpointError:
            continue
        if isinstance(record, dict) and record.get("format") == CACHE_FORMAT and isinstance(record.get("files"), dict):
            return record["files"], path
    return {}, None


def _write_cache(root: Path, known: Path | None, versions: dict) -> None:
    """Written whole (a temp file renamed over the cache) in the first place that can be written; with none, the
    files are hashed again next time."""
    data = json.dumps({"format": CACHE_FORMAT, "files": versions}, sort_keys=True).encode()
    for path in dict.fromkeys([known, root / CACHE_FILE, _user_cache(root)]):
        if path is None:
            continue
        temp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temp, path)
            return
        except OSError:  # read-only: try the next place
            if temp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
