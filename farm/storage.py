"""Shared storage: atomic publish, sidecars as commit markers, done checks, and the farm's own records.

A render is *published* file by file, each a temp file in the target folder, fsync, `os.replace`:
first the media (and the WAV of a clip's sound, when asked), then its JSON sidecar. The sidecar is the
commit marker: a job is done only when its sidecar exists, records the job's current config hash, and
every file the job must have is a regular file whose sha256 matches. A crash at any point leaves either
nothing, a temp file (swept by the driver), or media without a sidecar (not done, rendered again).

The output folder may be shared with others who can write it, so a temp file is created exclusively under a
random name (`O_CREAT | O_EXCL | O_NOFOLLOW`), written and hashed through its own descriptor, and renamed only
while it is still that file: a link planted in the folder is never written through nor published, and a
link at a final name is never counted done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from cosmos3.rules import json_text
from farm import template
from farm.errors import StorageFault
from farm.job import Job

SIDECAR_FORMAT = 1
RECORDS_DIR = ".farm"  # the farm's own records inside output.root; manifest templates may not write there
_CHUNK = 1 << 20


def sidecar_path(media: str | Path) -> Path:
    """`city/dusk_s7.mp4` -> `city/dusk_s7.mp4.json` (keeping the extension keeps PNG and MP4 sidecars apart)."""
    return Path(f"{media}.json")


_TEMP_TOKEN = 16  # hex digits of a temp name's random part
_HEX = frozenset("0123456789abcdef")
# Opening a temp: a new file or nothing (O_EXCL), never through a link (O_NOFOLLOW), not inherited by ffmpeg.
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_path(final: Path) -> Path:
    """`.{name}.{16 random hex digits}.tmp` beside `final`: hidden, unpredictable (nobody can plant a link at it
    beforehand), and recognised by `temp_target` by its exact shape, never by a pattern built from a file name."""
    return final.parent / f".{final.name}.{secrets.token_hex(_TEMP_TOKEN // 2)}.tmp"


def temp_target(name: str) -> str | None:
    """The file name a temp named `name` stands for (`.x.png.<16 hex digits>.tmp` -> `x.png`), read by its exact
    shape; None for any other name."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    target, _, token = name[1:-len(".tmp")].rpartition(".")
    if not target or len(token) != _TEMP_TOKEN or not set(token) <= _HEX:
        return None
    return target


def create_temp(final: Path) -> tuple[Path, IO[bytes]]:
    """A new, empty temp file beside `final`, created exclusively and opened for reading and writing.

    # Raises: OSError (EEXIST if the name was taken, which only a guess of 64 random bits can do).
    """
    temp = temp_path(final)
    return temp, open(temp, "w+b", opener=lambda path, _: os.open(path, _CREATE, 0o644))


def publish(final: Path, write: Callable[[IO[bytes]], None], root: str | Path | None = None) -> tuple[str, int]:
    """Has `write(out)` fill a temp file beside `final` through `out` (its binary handle; `out.name` is its path),
    makes it durable and renames it into place.

    With `root` (the output root), `final` is checked again to be inside it (`template.check_target`), and the root must
    still exist: publishing never creates it, so a root deleted mid-run fails loudly instead of coming back.
    Returns the sha256 and size of what was published. Nothing is left behind if `write` fails.

    # Raises: StorageFault (an OSError of the storage: ENOSPC, EROFS, EACCES, EISDIR, the root gone), OutputPathError.
    """
    if root is not None:
        if not Path(root).is_dir():
            raise StorageFault(f"output root {root} is gone (deleted or unmounted during the run?)")
        template.check_target(root, final, RECORDS_DIR)
    temp = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        temp, out = create_temp(final)
        with out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
            published = hash_handle(out)
            _rename_own(temp, final, os.fstat(out.fileno()))
        _fsync_dir(final.parent)
    except BaseException as err:
        if temp is not None:
            with contextlib.suppress(OSError):
                temp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno:
            raise StorageFault(f"{describe(err)} writing {final}") from err
        raise
    return published


def _rename_own(temp: Path, final: Path, own: os.stat_result) -> None:
    """Renames `temp` to `final` only while `temp` is still the file this process created (rename moves a link
    itself, never its target, and replaces a link at `final` rather than writing through it).

    # Raises: StorageFault (`temp` was swapped for another file), OSError (EISDIR: a folder stands at `final`).
    """
    now = os.lstat(temp)
    if (now.st_dev, now.st_ino) != (own.st_dev, own.st_ino) or not stat.S_ISREG(now.st_mode):
        raise StorageFault(f"{temp} was replaced by another file while it was written; {final} is left as it was "
                           "(is someone else writing into this folder?)")
    os.replace(temp, final)


class Publication:
    """One job's files published in order, its sidecar last (`with Publication(root) as p: p.file(...)`). If any
    step fails, the files it already published are removed again, so a media file never stands without the
    sidecar that vouches for it (a folder where the sidecar goes, a full disk between the two)."""

    def __init__(self, root: str | Path):
        self._root = root
        self._published: list[tuple[Path, int, int]] = []  # (path, st_dev, st_ino) of what this publication renamed

    def __enter__(self) -> Publication:
        return self

    def file(self, final: Path, write: Callable[[IO[bytes]], None]) -> tuple[str, int]:
        published = publish(final, write, self._root)
        with contextlib.suppress(OSError):
            now = os.lstat(final)
            self._published.append((final, now.st_dev, now.st_ino))
        return published

    def json(self, final: Path, data: Any) -> tuple[str, int]:
        return self.file(final, json_writer(data))

    def __exit__(self, kind, error, trace) -> None:
        if error is None:
            return
        for final, dev, ino in reversed(self._published):  # only while it is still the file published here
            with contextlib.suppress(OSError):
                now = os.lstat(final)
                if (now.st_dev, now.st_ino) == (dev, ino):
                    final.unlink()


def describe(err: OSError) -> str:
    """`ENOSPC (No space left on device)`: the code names the fault, the text explains it."""
    return f"{errno.errorcode.get(err.errno, err.errno)} ({os.strerror(err.errno)})"


def write_json(final: Path, data: Any, root: str | Path | None = None) -> tuple[str, int]:
    """Publishes a JSON file atomically (farm state, run summaries)."""
    return publish(final, json_writer(data), root)


def json_writer(data: Any) -> Callable[[IO[bytes]], None]:
    """Writes `data` as strict JSON: a NaN or infinity raises ValueError instead of writing `NaN`/`Infinity`, which
    other JSON readers refuse. Dataclasses are written as their fields, each when it is reached: a summary of
    10,000 jobs is never copied whole, nor held as one string."""
    encoder = json.JSONEncoder(indent=2, sort_keys=True, allow_nan=False, default=_fields)

    def write(out: IO[bytes]) -> None:
        for chunk in encoder.iterencode(data):
            out.write(chunk.encode())
        out.write(b"\n")

    return write


def _fields(value: Any) -> dict:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def name_max(folder: str | Path) -> int:
    """The longest file name, in bytes, that the file system of `folder` (or of its nearest existing parent) takes."""
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    try:
        return os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255  # POSIX's NAME_MAX where the file system does not say


def path_max() -> int:
    """The longest path, in bytes with its closing NUL, that the system's calls take (PATH_MAX, 4096 on Linux)."""
    try:
        return os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        return 4096


def too_long(path: str | Path) -> str | None:
    """Why the system would refuse `path` with ENAMETOOLONG as a whole (its bytes against PATH_MAX); None when it
    fits. Each name's own limit (NAME_MAX) is the file system's: `name_max`."""
    size, limit = len(os.fsencode(path)), path_max()
    if size >= limit:
        return f"the path is {size:,} bytes; the system takes paths of at most {limit - 1:,} (PATH_MAX)"
    return None


def unwritable(root: Path, final: Path, limit: int) -> str | None:
    """Why `final` (a file a job publishes, under `root`) could not be published, seen before anything renders;
    None when nothing is in the way. Checked: each name against the file system's limit of `limit` bytes, the
    longest the farm makes from it included (its sidecar's temp file), and that temp file's whole path against
    PATH_MAX; a folder, or anything but a file or a link, where the file or its sidecar goes; a file where a folder
    must go."""
    longest = temp_path(sidecar_path(final))
    for part in (*final.relative_to(root).parts[:-1], longest.name):
        if len(part.encode()) > limit:
            shown = "the file name" if part == longest.name else f"the folder name {part[:40]}..."
            return (f"{shown} is {len(part.encode())} bytes with the farm's temp and sidecar suffixes; the file "
                    f"system allows {limit} (shorten the job id or output.path)")
    if problem := too_long(longest):
        return (f"with the farm's temp and sidecar suffixes {problem} (shorten output.path or pick an output.root "
                "nearer /)")
    for folder in final.relative_to(root).parents:
        where = root / folder
        if where.exists() and not where.is_dir():
            return f"{where} is a file, where a folder of the output must go"
    for path in (final, sidecar_path(final)):
        if path.is_symlink() or not path.exists():
            continue
        if not path.is_file():
            kind = "a folder" if path.is_dir() else "not a regular file"
            return f"{path} is {kind}; the farm publishes a file there (move it away)"
    return None


def prepare_root(root: str | Path) -> None:
    """Makes the output root at submit start (publishing never creates it; `farm.records` makes its records folder).

    # Raises: StorageFault naming what is wrong.
    """
    check_root(root)
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StorageFault(f"output root {root}: {describe(err)} making it") from err


def check_root(root: str | Path) -> None:
    """The output root is a folder this process can write, or can be made (with its missing folders) in the
    nearest folder that exists, which `prepare_root` does at submit start.

    # Raises: StorageFault naming what is wrong.
    """
    root = Path(root)
    folder = next(p for p in (root, *root.parents) if p.exists())  # "/" exists
    missing = "" if folder == root else f" (missing: it would be made in {folder}; is the share mounted?)"
    if not folder.is_dir():
        raise StorageFault(f"output root {root}: {folder} is not a directory")
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise StorageFault(f"output root {root}: {folder} is on a read-only file system; "
                           f"mount it read-write or pick another output.root{missing}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StorageFault(f"output root {root}: {folder} is not writable by this user (uid {os.getuid()}); "
                           f"fix its permissions or pick another output.root{missing}")


def hash_handle(handle: IO[bytes]) -> tuple[str, int]:
    """The sha256 and size of what `handle` holds, read from its start."""
    handle.seek(0)
    digest, size = hashlib.sha256(), 0
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _fsync_dir(path: Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_regular(path: str | Path) -> IO[bytes]:
    """`path` opened for reading when it is a regular file, never through a link: a FIFO, a device (/dev/zero)
    or a link someone planted in the root would block a read or never end it.

    # Raises: OSError (ELOOP: `path` is a link; EISDIR / ENXIO or the check below: not a regular file).
    """
    handle = open(path, "rb", opener=lambda p, _: os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return handle


def input_sha256(path: str | Path) -> str:
    """The sha256 of a job's input (an i2v image, a v2v video), as its config hash takes it and as a worker checks
    it before and after it renders: a link is followed (an input may be a link to the user's file), but only a
    regular file is read, never blocking on a FIFO.

    # Raises: OSError (EINVAL: not a regular file).
    """
    with open(path, "rb", opener=lambda p, _: os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)) as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        return hash_handle(handle)[0]  # in chunks: an input may be gigabytes


def sha256_file(path: Path) -> tuple[str, int]:
    """The sha256 and size of the regular file at `path`, never read through a link.

    # Raises: OSError, as `open_regular`.
    """
    with open_regular(path) as handle:
        return hash_handle(handle)


def _file_record(path: str, published: tuple[str, int]) -> dict:
    digest, size = published
    return {"file": Path(path).name, "sha256": digest, "bytes": size}


def sidecar_record(job: Job, run: str, attempt: int, media: tuple[str, int], wav: tuple[str, int] | None = None,
                   **facts: Any) -> dict:
    """The sidecar record: the job as resolved, what rendered it, and each file's sha256 (what `check_published`
    reads): `media`, and `wav` when the job publishes one.

    `facts` are the render's provenance: manifest, checkpoint identity, precision and step policy used,
    per-stage timings, node, GPU, start and end times, the sound's rate and duration.
    """
    files = {"wav": _file_record(job.wav, wav)} if wav is not None else {}
    return {
        "format": SIDECAR_FORMAT,
        "key": job.key,
        "config_hash": job.config_hash,
        "run": run,
        "attempt": attempt,
        "seed": job.request.seed,
        "job": dataclasses.asdict(job),
        "media": _file_record(job.media, media),
        **files,
        **facts,
    }


def read_sidecar(media: str | Path) -> dict | None:
    """The sidecar of `media` as a mapping; None when it is missing, a link, not JSON or not a mapping."""
    return read_record(sidecar_path(media))[0]


# The sidecar's entry for each file a job publishes, in `Job.files` order: the media, then the WAV.
_FILE_ENTRIES = ("media", "wav")


def check_published(files: tuple[str, ...] | list[str], config_hash: str, attempt: tuple[str, int] | None = None,
                    *, content: bool = True) -> str | None:
    """None when the render of `config_hash` is published as `files` (a job's `files`: what the manifest says it
    must have, the media first); else why not. Each must be a regular file (not a link) whose sha256 and size are
    the ones its sidecar records: the sidecar's own list of files is never what decides.

    `attempt` (run id, attempt number) also requires that attempt to be the publisher: a result is only
    accepted from the attempt the driver is waiting for, never from a stale one. Without `content`, each file's
    size stands in for its sha256: a look that costs no reading of the media (`farm status` of 10,000 videos),
    which a deleted or truncated file fails but a replacement of the same size passes.
    """
    sidecar = read_sidecar(files[0])
    if sidecar is None:
        return "no sidecar"
    if sidecar.get("config_hash") != config_hash:
        return "sidecar records another config"
    if attempt is not None and (sidecar.get("run"), sidecar.get("attempt")) != attempt:
        return f"sidecar is from run {sidecar.get('run')} attempt {sidecar.get('attempt')}, not {attempt}"
    for entry, path in zip(_FILE_ENTRIES, files, strict=False):
        try:
            if content:
                found = sha256_file(Path(path))
            else:  # no reading: the size alone, of a regular file (lstat: a link is not one)
                info = os.lstat(path)
                found = (None, info.st_size) if stat.S_ISREG(info.st_mode) else None
        except FileNotFoundError:
            return f"{entry} missing"
        except OSError:  # ELOOP: a link; or a folder, a FIFO
            found = None
        if found is None:
            return f"{entry} is not a regular file"
        recorded = sidecar.get(entry) if isinstance(sidecar.get(entry), dict) else {}
        if (recorded.get("sha256") if content else None, recorded.get("bytes")) != found:
            return f"{entry} does not match its sidecar"
    return None


def is_done(job: Job) -> bool:
    return check_published(job.files, job.config_hash) is None


def discard_temps(*jobs: Job) -> int:
    """Removes temp files that earlier attempts of `jobs` left (a worker killed mid-write). Returns how many.

    Each folder is listed once however many jobs write there (a run's start sweeps 10,000 jobs of one folder in
    one listing, not 10,000), and names are matched literally (`temp_target`): glob characters in a file name
    match nothing but themselves.
    """
    targets: dict[Path, set[str]] = {}
    for job in jobs:
        for final in map(Path, (*job.files, sidecar_path(job.media))):
            targets.setdefault(final.parent, set()).add(final.name)
    removed = 0
    for folder, names in targets.items():
        try:
            entries = os.listdir(folder)
        except OSError:  # not made yet: nothing was written there
            continue
        for entry in entries:
            if temp_target(entry) in names:
                with contextlib.suppress(FileNotFoundError):
                    (folder / entry).unlink()
                    removed += 1
    return removed


RECORD_LIMIT = 512 << 20  # bytes of a JSON record or sidecar: a 400,000-job manifest's state is ~160 MB


def read_regular(fd: int) -> bytes:
    """Everything the regular file open at `fd` holds, refused by its size above RECORD_LIMIT before a byte is read
    (a 3 GB sparse file costs nothing to make and would cost 4 GB to read).

    # Raises: OSError (EINVAL: not a regular file; EFBIG: too large).
    """
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file")
    if info.st_size > RECORD_LIMIT:
        raise OSError(errno.EFBIG, f"{info.st_size:,} bytes, more than the {RECORD_LIMIT:,} any record of the farm "
                                   "holds")
    chunks, left = [], RECORD_LIMIT + 1  # a file that grows while it is read is cut at the limit, and refused
    while left and (chunk := os.read(fd, min(left, _CHUNK))):
        chunks.append(chunk)
        left -= len(chunk)
    if not left:
        raise OSError(errno.EFBIG, f"more than the {RECORD_LIMIT:,} bytes any record of the farm holds")
    return b"".join(chunks)


def new_run_id() -> str:
    """A run's id: when it started, to the second, and 6 random hex digits (`20261206-101949-183baa`)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def read_record(path: Path) -> tuple[dict | None, str | None]:
    """A JSON file the farm wrote outside its records folder (a sidecar, a checkpoint's fingerprint cache) as a
    mapping: (the mapping, None); (None, None) when there is none; (None, what is wrong with it, where, and what to
    do) when it is damaged or was edited by hand into something else. Never raises. The records under `.farm/` are
    read the same way, from their folder's descriptor (`farm.records.read`)."""
    try:
        with open_regular(path) as handle:
            data = read_regular(handle.fileno())
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, damaged(path, f"cannot be read ({err.strerror or err})")
    return parse_record(data, path)


def parse_record(data: bytes, path: Path) -> tuple[dict | None, str | None]:
    """`data` read from `path` as a mapping of strict JSON (NaN and Infinity are no JSON), or what is wrong."""
    try:
        record = json_text.loads(data, parse_constant=_not_json)
    except ValueError as err:  # also UnicodeDecodeError
        return None, damaged(path, f"cannot be read as JSON ({err})")
    if not isinstance(record, dict):
        return None, damaged(path, f"holds a JSON {type(record).__name__}, not a mapping")
    return record, None


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON number")


def damaged(path: Path, what: str) -> str:
    return (f"{path} {what}; the next farm submit of its manifest writes it again "
            f"(or remove it: the renders and their sidecars are not affected)")
