"""The farm's own records, `<output.root>/.farm/`: reached one name at a time from the root, never through a link.

`.farm/` sits in a folder others may write (a shared render root), so anyone there can plant a link, a FIFO, a
device, a folder or a 3 GB sparse file where a record goes. Every record access starts at `folder`, the one resolver:
it opens the root, then each folder below it with `O_NOFOLLOW | O_DIRECTORY` relative to the one before (`openat`),
so a link at `.farm`, `.farm/NAME` or `.farm/NAME/runs` is refused, never followed out of the root; the record
itself is opened, written, renamed, linked or removed relative to that descriptor, again with `O_NOFOLLOW`. Files
are opened with `O_NONBLOCK` and used only when they are regular files (a FIFO never blocks a read, an append or
a lock), and read only up to `storage.RECORD_LIMIT` bytes, judged by their size before a byte is read. Whatever
is in the way is an `OSError` whose message `fault` turns into one line naming the path.

Layout, per manifest name: `NAME/lease.json` (`farm.lease`), `NAME/state.json`, `NAME/events.jsonl`,
`NAME/runs/<run id>.json`, `NAME/claims.json` (`farm.claims`); `.claims.lock` beside the manifests' folders.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from farm import storage
from farm.errors import StorageFault

STATE_FILE = "state.json"
EVENTS_FILE = "events.jsonl"
RUNS_DIR = "runs"
LOCK_FILE = ".claims.lock"  # a dot first: no manifest name (an id starts with a letter or digit) is it
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def path(root: str | Path, *names: str) -> Path:
    """`ROOT/.farm/<names>`, for messages: never opened as a whole."""
    return Path(root, storage.RECORDS_DIR, *names)


def longest_record(root: str | Path, name: str) -> Path:
    """The longest path the records of manifest `name` take: a run summary's temp file (every run id is as long).
    Records are reached one name at a time, never by this path, but people and tools read them by it."""
    return storage.temp_path(path(root, name, RUNS_DIR, f"{storage.new_run_id()}.json"))


@contextlib.contextmanager
def folder(root: str | Path, *names: str, create: bool = False) -> Iterator[int]:
    """A descriptor of the records folder `ROOT/.farm/<names>`, each folder below the root opened from the one
    above it and never through a link; with `create`, missing folders are made on the way (the root never is).

    # Raises: OSError (ELOOP: a link; ENOTDIR: a file or a special file; ENOENT: missing without `create`).
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the user's own path, as given
    try:
        for name in (storage.RECORDS_DIR, *names):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            inner = os.open(name, _FOLDER, dir_fd=fd)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def fault(err: OSError, where: Path, doing: str) -> str:
    """One line for an OSError met at the record `where`: what stands there and what to do."""
    return f"cannot {doing} {where}: {_why(err)}"


def _why(err: OSError) -> str:
    if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.EINVAL):
        return (f"{err.strerror or err} (something other than the farm's own record or folder is there, or on the "
                f"way to it: a link, a file, a folder, a FIFO or a device; the farm never follows or waits on one: "
                f"remove it)")
    if err.errno == errno.EFBIG:
        return f"{err.strerror} (not a record the farm wrote: remove it)"
    return storage.describe(err)


def read_bytes(fd: int, name: str) -> tuple[bytes, os.stat_result]:
    """The record `name` in the folder `fd`, whole, with its status.

    # Raises: OSError (FileNotFoundError; ELOOP: a link; EINVAL: not a regular file; EFBIG: too large).
    """
    handle = os.open(name, _READ, dir_fd=fd)
    try:
        return storage.read_regular(handle), os.fstat(handle)
    finally:
        os.close(handle)


def read(root: str | Path, *names: str) -> tuple[dict | None, str | None]:
    """The JSON record `ROOT/.farm/<names>` as a mapping, as `storage.read_record` reads a path: (the mapping,
    None), (None, None) when there is none, (None, what is wrong and what to do). Never raises."""
    where = path(root, *names)
    try:
        with folder(root, *names[:-1]) as fd:
            data = read_bytes(fd, names[-1])[0]
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, storage.damaged(where, f"cannot be read: {_why(err)}")
    return storage.parse_record(data, where)


def write(root: str | Path, *names: str, data: Any) -> None:
    """Publishes the JSON record `ROOT/.farm/<names>` atomically (a temp file beside it, fsync, rename), making its
    folders where missing.

    # Raises: StorageFault naming the record and what is in the way.
    """
    where = path(root, *names)
    name = names[-1]
    temp = storage.temp_path(Path(name)).name
    try:
        with folder(root, *names[:-1], create=True) as fd:
            out = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                with os.fdopen(out, "wb", closefd=False) as handle:
                    storage.json_writer(data)(handle)
                os.fsync(out)
                os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)  # replaces a link at `name`, never writes it
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=fd)
                raise
            finally:
                os.close(out)
    except OSError as err:
        raise StorageFault(fault(err, where, "write")) from err


def open_log(root: str | Path, *names: str) -> int:
    """A descriptor appending to the record `ROOT/.farm/<names>` (made if missing), a regular file only.

    # Raises: StorageFault naming the record and what is in the way.
    """
    where = path(root, *names)
    try:
        with folder(root, *names[:-1], create=True) as fd:
            # O_NONBLOCK: a FIFO with no reader fails (ENXIO) instead of blocking; with one, fstat refuses it.
            log = os.open(names[-1], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                          | os.O_CLOEXEC, 0o644, dir_fd=fd)
        if not stat.S_ISREG(os.fstat(log).st_mode):
            os.close(log)
            raise OSError(errno.EINVAL, "not a regular file")
        return log
    except OSError as err:
        raise StorageFault(fault(err, where, "append to")) from err


@contextlib.contextmanager
def lock(root: str | Path) -> Iterator[None]:
    """The root's records lock (`.farm/.claims.lock`), held exclusively meanwhile; released when its descriptor
    closes, also if this process dies.

    # Raises: StorageFault naming the lock and what is in the way.
    """
    where = path(root, LOCK_FILE)
    try:
        with folder(root, create=True) as fd:
            held = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                           dir_fd=fd)
        if not stat.S_ISREG(os.fstat(held).st_mode):
            os.close(held)
            raise OSError(errno.EINVAL, "not a regular file")
    except OSError as err:
        raise StorageFault(fault(err, where, "take the claims lock")) from err
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield
    finally:
        os.close(held)


def entries(root: str | Path, *names: str) -> dict[str, bool] | None:
    """The names in the records folder `ROOT/.farm/<names>`, each with whether it is a folder (links are not);
    None when the folder does not exist.

    # Raises: StorageFault naming the folder and what is in the way.
    """
    where = path(root, *names)
    try:
        with folder(root, *names) as fd, os.scandir(fd) as found:
            return {entry.name: entry.is_dir(follow_symlinks=False) for entry in found}
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StorageFault(fault(err, where, "list")) from err


# -- the state of a manifest: NAME/state.json --------------------------------------------------------------


def read_states(root: str | Path) -> dict[str, dict]:
    """Every manifest's state under a root, by manifest name (`read_state`); the records folders only, never a link.

    # Raises: StorageFault when `.farm` itself cannot be listed (a link, a file).
    """
    states = {}
    for name, is_folder in sorted((entries(root) or {}).items()):
        if is_folder and (state := read_state(root, name)) is not None:  # None: removed since the listing
            states[name] = state
    return states


def read_state(root: str | Path, name: str) -> dict | None:
    """The state of manifest `name` under a root, its `jobs` keeping only entries of the expected shape and values
    in range; a state that cannot be used is `{"unreadable": why and what to do}`; None when there is none."""
    where = path(root, name, STATE_FILE)
    state, problem = read(root, name, STATE_FILE)
    if state is None and problem is None:
        return None
    jobs = state.get("jobs") if state is not None else None
    if state is not None and not isinstance(jobs, dict):
        problem = storage.damaged(where, "has no mapping of jobs")
    if problem:
        return {"unreadable": problem}
    state["jobs"] = {key: entry for key, entry in jobs.items() if _state_entry_ok(entry)}
    if len(state["jobs"]) < len(jobs):
        state["damaged"] = storage.damaged(where, f"has {len(jobs) - len(state['jobs'])} job entries that are not "
                                                  "mappings with media, files and config_hash in range (left out)")
    for key in ("run", "result"):
        if not isinstance(state.get(key), str):
            state[key] = "unknown"
    return state


_STATES = ("done", "failed", "pending")
_MOST_ATTEMPTS = 10**6


def _state_entry_ok(entry: Any) -> bool:
    """A job entry as the driver writes it: its paths absolute, without NUL, within PATH_MAX; its state one of the
    job states; its attempts a count; its error a string or none (entries written before `files` lack it)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("config_hash"), str):
        return False
    files = entry.get("files", [entry.get("media")])
    if not (isinstance(files, list) and files and all(_path_ok(f) for f in files) and _path_ok(entry.get("media"))):
        return False
    attempts = entry.get("attempts", 0)
    return (entry.get("state", "pending") in _STATES and isinstance(entry.get("error"), (str, type(None)))
            and isinstance(attempts, int) and not isinstance(attempts, bool) and 0 <= attempts <= _MOST_ATTEMPTS)


def _path_ok(value: Any) -> bool:
    return (isinstance(value, str) and value.startswith("/") and "\0" not in value
            and storage.too_long(value) is None)


def state_files(entry: dict) -> list[str]:
    """The files a state entry's job publishes (an entry written before `files` was recorded: its media)."""
    return entry.get("files", [entry["media"]])
