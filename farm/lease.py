"""One writer per output root and manifest name: a lease file in the manifest's records folder.

`<root>/.farm/<name>/lease.json` names its owner (host, pid, run id, manifest). It is created atomically: a
complete temp file is hard-linked into place, which fails when a lease exists, on local disks and NFS alike
(where hard links are not supported, as on some FUSE mounts, an O_EXCL create stands in). The owner touches
it every REFRESH seconds while the run lasts and removes it at the end. A lease is stale when its owner is
known dead (same host, pid gone) or it was not touched for STALE seconds (a driver on another host that was
SIGKILLed or lost its node). A stale lease is renamed aside before it is replaced, so of two drivers taking
it over at once only one can; a driver that finds its own lease gone or replaced stops its run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from farm import storage
from farm.errors import FarmError

REFRESH = 5.0  # seconds between touches of a held lease
STALE = 60.0  # seconds without a touch after which the owner is taken for dead (allowing for clock skew)
LEASE_FILE = "lease.json"


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    run: str
    manifest: str  # path of the manifest the run renders
    started: float  # time.time() when the lease was taken

    @classmethod
    def this_process(cls, run: str, manifest: str) -> Owner:
        return cls(socket.gethostname(), os.getpid(), run, manifest, time.time())

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"run {self.run} (pid {self.pid} on {self.host}, since {started}, manifest {self.manifest})"


class LeaseHeld(FarmError):
    """Another live driver renders this manifest name into this root."""

    def __init__(self, path: Path, holder: Owner):
        self.holder = holder
        super().__init__(f"{path.parent.name} in {path.parents[2]} is being rendered by {holder.describe()}; "
                         "wait for it (farm submit --wait), or stop that run first")


def pid_alive(pid: int) -> bool:
    """Whether a process of this host exists (signal 0 only checks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def read(path: Path) -> Owner | None:
    """The lease's owner; None when there is no lease or it cannot be read (half-written by hand, damaged)."""
    try:
        return Owner(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def holder(path: Path) -> Owner | None:
    """The owner of a live lease at `path`, else None (no lease, or a stale one: its run was interrupted)."""
    owner = read(path)
    return owner if owner is not None and not _stale(path, owner) else None


def _stale(path: Path, owner: Owner | None) -> bool:
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False  # released meanwhile: not stale, just gone
    if owner is not None and owner.host == socket.gethostname() and not pid_alive(owner.pid):
        return True
    return age > STALE


class Lease:
    """A held lease; `release()` gives it back. While refreshing, `on_lost(reason)` is called (from the refresh
    thread) if the lease file vanishes or another driver took it over."""

    def __init__(self, path: Path, owner: Owner):
        self.path, self.owner = path, owner
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def keep(self, on_lost: Callable[[str], None]) -> None:
        self._thread = threading.Thread(target=self._refresh, args=(on_lost,), name="farm-lease", daemon=True)
        self._thread.start()

    def _refresh(self, on_lost: Callable[[str], None]) -> None:
        while not self._stop.wait(REFRESH):
            current = read(self.path)
            if current is None and not self.path.exists():
                on_lost(f"its lease {self.path} vanished (was the output root deleted or unmounted?)")
                return
            if current is not None and current.run != self.owner.run:
                on_lost(f"{current.describe()} took over its lease (this driver was not heard from for {STALE:g} s)")
                return
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if (read(self.path) or self.owner).run == self.owner.run:
            self.path.unlink(missing_ok=True)


def acquire(path: Path, owner: Owner, *, wait: bool = False, on_wait: Callable[[Owner], None] | None = None,
            poll: float = REFRESH) -> Lease:
    """Takes the lease at `path`. A live holder: LeaseHeld, or with `wait`, waits until it is released or stale.

    # Raises: LeaseHeld; OSError when the folder cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    waited_for = None
    while True:
        if _create(path, owner):
            return Lease(path, owner)
        current = read(path)
        if _stale(path, current):
            _take_over(path, current)
            continue
        if current is None:  # released meanwhile, or being written by hand: look again
            time.sleep(0.05)
            continue
        if not wait:
            raise LeaseHeld(path, current)
        if on_wait is not None and current != waited_for:
            on_wait(current)
            waited_for = current
        time.sleep(poll)


def _create(path: Path, owner: Owner) -> bool:
    """Puts a complete lease at `path` unless one is there (then False)."""
    text = json.dumps(asdict(owner), indent=2) + "\n"
    temp, handle = storage.create_temp(path)
    with handle:
        handle.write(text.encode())
    try:
        os.link(temp, path)
        return True
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        return _create_exclusive(path, text)  # no hard links on this file system
    finally:
        temp.unlink(missing_ok=True)


def _create_exclusive(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return True


def _take_over(path: Path, judged: Owner | None) -> None:
    """Moves the stale lease aside; if what moved is not the lease judged stale (another driver replaced it in
    the meantime), puts it back."""
    aside = path.with_name(f".{path.name}.stale.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if read(aside) != judged:
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
    finally:
        aside.unlink(missing_ok=True)
