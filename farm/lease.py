"""One writer per output root and manifest name: a lease file in the manifest's records folder.

`<root>/.farm/<name>/lease.json` names its owner (host, pid, run id, manifest). It is created atomically: a
complete temp file is hard-linked into place, which fails when a lease exists, on local disks and NFS alike
(where hard links are not supported, as on some FUSE mounts, an O_EXCL create stands in). The owner touches
it every REFRESH seconds while the run lasts and removes it at the end.

Whether an owner is alive is judged without comparing clocks, since drivers on different hosts (and the file
server) need not agree on the time: an owner on this host is alive while its pid is; an owner elsewhere is alive
while its touches keep changing the file's modification time, and dead once the reader, timing on its own
monotonic clock, has seen it stand still for STALE seconds. The time a touch records is never read as a time,
only compared with the last one seen, so a clock minutes off on either side changes nothing. A lease judged
dead is renamed aside before it is replaced, so of two drivers taking it over at once only one can; a driver
that finds its own lease gone or replaced stops its run.
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
from enum import Enum
from pathlib import Path

from cosmos3.rules import json_text
from farm import records, storage
from farm.errors import FarmError, StorageFault
from farm.processes import identity, is_running

REFRESH = 5.0  # seconds between touches of a held lease
STALE = 60.0  # seconds of the reader's monotonic clock a lease elsewhere may go untouched before its owner is dead
GARBLED = 1.0  # seconds a lease may read as garbled before it is reported (an O_EXCL create is being written)
LEASE_FILE = "lease.json"
PID_MAX = 4_194_304  # Linux's PID_MAX_LIMIT: no process id is larger (0 and -1 name groups, not a process)
LATEST = 253402300799.0  # 9999-12-31 23:59:59 UTC, the last second a date can show


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    run: str
    manifest: str  # path of the manifest the run renders
    started: float  # time.time() when the lease was taken, for people to read
    process: str = ""  # farm.processes.identity of the driver: its pid, reused later, is no longer it ("" unknown)

    @classmethod
    def this_process(cls, run: str, manifest: str) -> Owner:
        return cls(socket.gethostname(), os.getpid(), run, manifest, time.time(), identity(os.getpid()))

    @classmethod
    def parse(cls, text: str) -> Owner:
        """# Raises: ValueError saying what is wrong with the text."""
        data = json_text.loads(text)
        kinds = {"host": str, "pid": int, "run": str, "manifest": str, "started": (int, float), "process": str}
        if isinstance(data, dict):
            data.setdefault("process", "")  # a lease written before drivers named their process: the pid alone
        if not isinstance(data, dict) or set(data) != set(kinds):
            raise ValueError(f"expected the keys {', '.join(kinds)}")
        wrong = [key for key, kind in kinds.items() if not isinstance(data[key], kind) or isinstance(data[key], bool)]
        if wrong:
            raise ValueError(f"wrong type of {', '.join(wrong)}")
        if not 1 <= data["pid"] <= PID_MAX:
            raise ValueError(f"pid {data['pid']} is no process id (1 to {PID_MAX:,})")
        if not 0 <= data["started"] <= LATEST:  # also NaN, which compares false
            raise ValueError(f"started {data['started']} is no time (seconds since 1970, up to the year 9999)")
        return cls(**data)

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"run {self.run} (pid {self.pid} on {self.host}, since {started}, manifest {self.manifest})"


@dataclass(frozen=True)
class Look:
    """What one read of a lease file found."""

    owner: Owner | None  # None: the file is not a lease (garbled, edited by hand)
    beat: tuple[int, int]  # (inode, mtime in ns): changes with every touch and every new lease
    problem: str | None = None  # why `owner` is None
    mtime: float = 0.0  # the touch's time by the toucher's (or file server's) clock: a hint for people only


class LeaseHeld(FarmError):
    """Another live driver renders this manifest name into this root."""

    def __init__(self, path: Path, holder: Owner):
        self.holder = holder
        super().__init__(f"{path.parent.name} in {path.parents[2]} is being rendered by {holder.describe()}; "
                         "wait for it (farm submit --wait), or stop that run first")


class LeaseDamaged(FarmError):
    """The lease file is there but is not a lease: no driver can tell whether another one runs."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path} is not a lease the farm wrote ({problem}); if no `farm submit` of "
                         f"{path.parent.name} into {path.parents[2]} is running (check its host), delete the file "
                         "and submit again")


def _where(path: Path) -> tuple[Path, str]:
    """The output root and manifest name of the lease `ROOT/.farm/NAME/lease.json`, as `farm.records` reaches it."""
    if path.name != LEASE_FILE or path.parents[1].name != storage.RECORDS_DIR:
        raise ValueError(f"{path} is not a lease's path (ROOT/.farm/NAME/{LEASE_FILE})")
    return path.parents[2], path.parent.name


def look(path: Path) -> Look | None:
    """Reads the lease at `path`; None when there is none. Opening the file (rather than a stat of the path)
    makes an NFS client fetch its attributes afresh (close-to-open), so a touch elsewhere is seen."""
    root, name = _where(path)
    try:
        with records.folder(root, name) as fd:
            data, stat = records.read_bytes(fd, LEASE_FILE)
    except FileNotFoundError:
        return None
    except OSError as err:
        return Look(None, (0, 0), records.fault(err, path, "read"))
    beat = (stat.st_ino, stat.st_mtime_ns)
    try:
        return Look(Owner.parse(data.decode("utf-8", "replace")), beat, mtime=stat.st_mtime)
    except (ValueError, TypeError) as err:
        return Look(None, beat, f"{type(err).__name__}: {err}" if str(err) else "empty", stat.st_mtime)


def read(path: Path) -> Owner | None:
    """The lease's owner; None when there is no lease or it is not one (garbled)."""
    seen = look(path)
    return seen.owner if seen is not None else None


def holder(path: Path) -> Owner | None:
    """The owner of the lease at `path` unless it looks dead at a glance (for `farm status`, which cannot watch
    for a minute). An owner elsewhere looks dead when its last touch is STALE seconds older than this host's
    clock: a hint that clock skew can mislead, so it never decides a takeover (`acquire` watches instead)."""
    seen = look(path)
    if seen is None or seen.owner is None:
        return None
    if seen.owner.host == socket.gethostname():
        return seen.owner if is_running(seen.owner.pid, seen.owner.process) else None
    return seen.owner if time.time() - seen.mtime <= STALE else None


class Verdict(Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # an owner elsewhere whose touches have not been watched long enough


class Watch:
    """Judges one lease's owner from successive looks, timing them on this process's monotonic clock."""

    def __init__(self) -> None:
        self.first: tuple[int, int] | None = None  # the beat of the first look
        self.beat: tuple[int, int] | None = None
        self.since = 0.0  # monotonic time `beat` was first seen

    def judge(self, seen: Look) -> Verdict:
        now = time.monotonic()
        if seen.beat != self.beat:
            self.beat, self.since = seen.beat, now
            self.first = self.first or seen.beat
        owner = seen.owner
        if owner is not None and owner.host == socket.gethostname():
            return Verdict.ALIVE if is_running(owner.pid, owner.process) else Verdict.DEAD
        if now - self.since > STALE:
            return Verdict.DEAD
        return Verdict.ALIVE if owner is not None and seen.beat != self.first else Verdict.UNKNOWN

    def unchanged_for(self) -> float:
        return time.monotonic() - self.since


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
            seen = look(self.path)
            if seen is None:
                on_lost(f"its lease {self.path} vanished (was the output root deleted or unmounted?)")
                return
            if seen.owner is None or seen.owner.run != self.owner.run:
                taker = seen.owner.describe() if seen.owner else f"a damaged lease ({seen.problem})"
                on_lost(f"{taker} took over its lease (no touch of it was seen for {STALE:g} s)")
                return
            # The touch's time only has to differ from the last one; this host's clock is as good as any.
            now = time.time()
            root, name = _where(self.path)
            with contextlib.suppress(OSError), records.folder(root, name) as fd:
                os.utime(LEASE_FILE, (now, now), dir_fd=fd, follow_symlinks=False)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if (read(self.path) or self.owner).run == self.owner.run:
            root, name = _where(self.path)
            with contextlib.suppress(FileNotFoundError), records.folder(root, name) as fd:
                os.unlink(LEASE_FILE, dir_fd=fd)


def acquire(path: Path, owner: Owner, *, wait: bool = False, on_wait: Callable[[Owner, str], None] | None = None,
            poll: float = 1.0) -> Lease:
    """Takes the lease at `path`. A live holder: LeaseHeld, or with `wait`, waits until it is released or dead.
    A holder on another host is watched until a touch shows it alive or STALE seconds without one show it dead;
    `on_wait(holder, why)` says so once per holder.

    # Raises: LeaseHeld; LeaseDamaged (the file is not a lease); StorageFault when its folder cannot be written.
    """
    watch, told = Watch(), None
    while True:
        if _create(path, owner):
            return Lease(path, owner)
        seen = look(path)
        if seen is None:  # released meanwhile
            continue
        verdict = watch.judge(seen)
        if seen.owner is None:
            if watch.unchanged_for() > GARBLED:
                raise LeaseDamaged(path, seen.problem or "unreadable")
        elif verdict is Verdict.DEAD:
            _take_over(path, seen)
            watch = Watch()
            continue
        elif verdict is Verdict.ALIVE and not wait:
            raise LeaseHeld(path, seen.owner)
        elif on_wait is not None and (seen.owner, verdict) != told:
            why = (f"its driver's host {seen.owner.host} is not this one: watching its lease for a touch "
                   f"(one every {REFRESH:g} s while it lives; {STALE:g} s without one: taken over)"
                   if verdict is Verdict.UNKNOWN else "waiting for it to end (--wait)")
            on_wait(seen.owner, why)
            told = (seen.owner, verdict)
        time.sleep(poll)


def _create(path: Path, owner: Owner) -> bool:
    """Puts a complete lease at `path` unless one is there (then False).

    # Raises: StorageFault naming the lease's folder or what stands in the way.
    """
    root, name = _where(path)
    text = (json.dumps(asdict(owner), indent=2) + "\n").encode()
    temp = storage.temp_path(Path(LEASE_FILE)).name
    try:
        with records.folder(root, name, create=True) as fd:
            _write_new(fd, temp, text)
            try:
                os.link(temp, LEASE_FILE, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                return True
            except FileExistsError:
                return False
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                return _write_new(fd, LEASE_FILE, text)  # no hard links on this file system: an O_EXCL create
            finally:
                os.unlink(temp, dir_fd=fd)
    except OSError as err:
        raise StorageFault(records.fault(err, path, "take the lease")) from err


def _write_new(fd: int, name: str, text: bytes) -> bool:
    """Writes `text` to a new file `name` in the folder `fd`; False when `name` exists."""
    try:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
    except FileExistsError:
        return False
    with os.fdopen(out, "wb") as handle:
        handle.write(text)
    return True


def _take_over(path: Path, judged: Look) -> None:
    """Moves the dead lease aside; if what moved is not the lease judged dead (touched since, or another driver
    replaced it in the meantime: a rename keeps inode and mtime), puts it back."""
    root, name = _where(path)
    aside = f".{LEASE_FILE}.stale.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        with records.folder(root, name) as fd:
            try:
                os.rename(LEASE_FILE, aside, src_dir_fd=fd, dst_dir_fd=fd)
            except FileNotFoundError:
                return
            try:
                moved = os.stat(aside, dir_fd=fd, follow_symlinks=False)
                if (moved.st_ino, moved.st_mtime_ns) != judged.beat:
                    with contextlib.suppress(FileExistsError):
                        os.link(aside, LEASE_FILE, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            finally:
                os.unlink(aside, dir_fd=fd)
    except OSError as err:
        raise StorageFault(records.fault(err, path, "take over the dead lease")) from err
