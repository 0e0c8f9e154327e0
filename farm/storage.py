"""Shared storage: atomic publish, sidecars as commit markers, done checks, and the farm's own records.

A render is *published* file by file, each a temp file in the target folder, fsync, `os.replace`:
first the media (and the WAV of a clip's sound, when asked), then its JSON sidecar. The sidecar is the
commit marker: a job is done only when its sidecar exists, records the job's current config hash, and
the sha256 of every file it lists matches. A crash at
any point leaves either nothing, a temp file (swept by the driver), or media without a sidecar
(not done, rendered again). Temp names carry the attempt so two attempts never share one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from farm import template
from farm.errors import StorageFault
from farm.job import Job, wav_beside

SIDECAR_FORMAT = 1
RECORDS_DIR = ".farm"  # the farm's own records inside output.root; manifest templates may not write there
_CHUNK = 1 << 20


def sidecar_path(media: str | Path) -> Path:
    """`city/dusk_s7.mp4` -> `city/dusk_s7.mp4.json` (keeping the extension keeps PNG and MP4 sidecars apart)."""
    return Path(f"{media}.json")


def _temp_path(final: Path, attempt: int) -> Path:
    # Hidden, named after its target and attempt, so `discard_temps` finds exactly a job's leftovers.
    return final.parent / f".{final.name}.a{attempt}.{os.getpid()}.tmp"


def _temp_target(name: str) -> str | None:
    """The name of the file a `_temp_path` name stands for (`.x.png.a2.77.tmp` -> `x.png`); None for other names."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    parts = name[1:-len(".tmp")].rsplit(".", 2)
    if len(parts) != 3 or parts[1][:1] != "a" or not parts[1][1:].isdigit() or not parts[2].isdigit():
        return None
    return parts[0]


def publish(final: Path, attempt: int, write: Callable[[Path], None],
            root: str | Path | None = None) -> tuple[str, int]:
    """Has `write(temp)` fill a temp file beside `final`, makes it durable and renames it into place.

    With `root` (the output root), `final` is checked again to be inside it (`template.check_target`), and the root must
    still exist: publishing never creates it, so a root deleted mid-run fails loudly instead of coming back.
    Returns the sha256 and size of what was published. Nothing is left behind if `write` fails.

    # Raises: StorageFault (an OSError of the storage: ENOSPC, EROFS, EACCES, the root gone), OutputPathError.
    """
    if root is not None:
        if not Path(root).is_dir():
            raise StorageFault(f"output root {root} is gone (deleted or unmounted during the run?)")
        template.check_target(root, final, RECORDS_DIR)
    temp = _temp_path(final, attempt)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        write(temp)
        digest, size = _fsync_and_hash(temp)
        os.replace(temp, final)
        _fsync_dir(final.parent)
    except BaseException as err:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno:
            raise StorageFault(f"{_errno(err)} writing {final}") from err
        raise
    return digest, size


def _errno(err: OSError) -> str:
    """`ENOSPC (No space left on device)`: the code names the fault, the text explains it."""
    return f"{errno.errorcode.get(err.errno, err.errno)} ({os.strerror(err.errno)})"


def write_json(final: Path, data: Any, attempt: int = 0, root: str | Path | None = None) -> None:
    """Publishes a JSON file atomically (sidecars, farm state, run summaries). Dataclasses in `data` are written as
    their fields, each when it is reached: a summary of 10,000 jobs is never copied whole, nor held as one string."""

    def write(temp: Path) -> None:
        with open(temp, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True, default=_fields)
            handle.write("\n")

    publish(final, attempt, write, root)


def _fields(value: Any) -> dict:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def prepare_root(root: str | Path) -> None:
    """Makes the output root and its records folder at submit start (publishing never creates the root).

    # Raises: StorageFault naming what is wrong.
    """
    check_root(root)
    try:
        (Path(root) / RECORDS_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StorageFault(f"output root {root}: {_errno(err)} making {Path(root) / RECORDS_DIR}") from err


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


def _fsync_and_hash(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb+") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        os.fsync(handle.fileno())
    return digest.hexdigest(), size


def _fsync_dir(path: Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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
    try:
        data = json.loads(sidecar_path(media).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_published(media: str | Path, config_hash: str, attempt: tuple[str, int] | None = None, *,
                    content: bool = True) -> str | None:
    """None when the render of `config_hash` is published at `media`; else why not.

    `attempt` (run id, attempt number) also requires that attempt to be the publisher: a result is only
    accepted from the attempt the driver is waiting for, never from a stale one. Without `content`, each file's
    size stands in for its sha256: a look that costs no reading of the media (`farm status` of 10,000 videos),
    which a deleted or truncated file fails but a replacement of the same size passes.
    """
    sidecar = read_sidecar(media)
    if sidecar is None:
        return "no sidecar"
    if sidecar.get("config_hash") != config_hash:
        return "sidecar records another config"
    if attempt is not None and (sidecar.get("run"), sidecar.get("attempt")) != attempt:
        return f"sidecar is from run {sidecar.get('run')} attempt {sidecar.get('attempt')}, not {attempt}"
    files = {"media": Path(media)}
    if "wav" in sidecar:
        files["wav"] = wav_beside(media)
    for name, path in files.items():
        try:
            actual = sha256_file(path) if content else os.stat(path).st_size
        except OSError:
            return f"{name} missing"
        if actual != (sidecar.get(name) or {}).get("sha256" if content else "bytes"):
            return f"{name} does not match its sidecar"
    return None


def is_done(job: Job) -> bool:
    return check_published(job.media, job.config_hash) is None


def discard_temps(*jobs: Job) -> int:
    """Removes temp files that earlier attempts of `jobs` left (a worker killed mid-write). Returns how many.

    Each folder is listed once however many jobs write there (a run's start sweeps 10,000 jobs of one folder in
    one listing, not 10,000), and names are compared whole, never used as glob patterns.
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
            if _temp_target(entry) in names:
                (folder / entry).unlink(missing_ok=True)
                removed += 1
    return removed


# -- the farm's own records: <output.root>/.farm/<manifest name>/ -----------------------------------------


def records_dir(output_root: str | Path, name: str) -> Path:
    return Path(output_root) / RECORDS_DIR / name


def state_path(output_root: str | Path, name: str) -> Path:
    """Per-job state of a manifest (done / failed / pending), outliving the cluster; `farm status` reads it."""
    return records_dir(output_root, name) / "state.json"


def events_path(output_root: str | Path, name: str) -> Path:
    return records_dir(output_root, name) / "events.jsonl"


def summary_path(output_root: str | Path, name: str, run_id: str) -> Path:
    return records_dir(output_root, name) / "runs" / f"{run_id}.json"


def read_states(output_root: str | Path) -> dict[str, dict]:
    """Every manifest's state file under a root, by manifest name."""
    states = {}
    for path in sorted((Path(output_root) / RECORDS_DIR).glob("*/state.json")):
        try:
            states[path.parent.name] = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            states[path.parent.name] = {"unreadable": f"{path}: {err}"}
    return states
