"""Who owns each path the farm writes: one manifest per path, whatever the manifests' names or roots.

Two manifests whose templates resolve to one file would overwrite each other's renders (and each would then count
the other's render as its own not done). So a manifest claims the files its jobs publish:
`<root>/.farm/<name>/claims.json` lists them, relative to the root, with the manifest's path. What a manifest
writes is each of its files and its sidecar (`.json`), and the folders above them; the paths are compared as a
tree, so one manifest's file is never another's file, nor a folder of another's (`{task}/{id}/x` beside an id
`a_s0.png`), nor inside another root's records (`.farm/`).

Claims are compared across roots: a root is any folder holding `.farm/`, and a manifest's files are compared with
the claims of its own root, of every root above it, and of every root on the way from it to one of its files (a
root nested inside it that it writes into). Two roots that do not nest, or that nest without either writing into
the other's paths, never meet.

Claims fail closed: another manifest whose `claims.json` is missing, damaged or not a claims record is asked
through its `state.json` (every job's files, written at each submit); when neither can be read, and its records
folder holds anything but a lease (a driver between its lease and its claims, which claims after this one under
the lock), no manifest that meets that root may claim or validate until its claims are known again, and the
message names the file and the fix. A records folder removed whole retires its manifest.

A submit rewrites its claims (jobs removed from the manifest give their files back) under the exclusive lock
`.farm/.claims.lock` of every root it meets, taken in path order and held from reading the others' claims to
publishing its own, so of two submits started at once only one can take a path. Validate and plan only read.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock

from farm import lease, storage, template
from farm.errors import FarmError, StorageFault

CLAIMS_FILE = "claims.json"
LOCK_FILE = ".claims.lock"  # a dot first: no manifest name (an id starts with a letter or digit) is it
CLAIMS_FORMAT = 1
_SHOWN = 10  # conflicts listed in a refusal


class ClaimConflict(FarmError):
    """Paths of this manifest are another manifest's."""


class ClaimsUnknown(FarmError):
    """Another manifest's claims cannot be read, so whether this manifest would overwrite its files is unknown."""


def claims_path(root: str | Path, name: str) -> Path:
    return storage.records_dir(root, name) / CLAIMS_FILE


def wanted(manifest) -> dict[str, str]:
    """Every file the manifest's jobs publish, where it is really written (its folders' symlinks resolved, as
    publishing follows them), relative to its root -> the job's key."""
    real_root = Path(manifest.output_root).resolve()
    folders: dict[str, str] = {}  # each folder's real path relative to the root, resolved once however many jobs
    files = {}
    for job in manifest.jobs:
        for path in job.files:
            folder, name = os.path.split(path)
            if folder not in folders:
                real = template.check_target(manifest.output_root, path, storage.RECORDS_DIR)
                folders[folder] = str(real.parent.relative_to(real_root))
            files[os.path.normpath(os.path.join(folders[folder], name))] = job.key
    return files


def check(manifest) -> None:
    """Refuses a manifest that would write a path another manifest owns (a read; nothing is written).

    # Raises: ClaimConflict naming, for the first paths taken, the other manifest and its job; ClaimsUnknown
    # (another manifest's claims cannot be read), StorageFault (a records folder cannot be listed).
    """
    mine = _Mine(manifest)
    _refuse_another_of_this_name(mine)
    _refuse_taken(mine, _roots(mine))


def claim(manifest) -> None:
    """Claims the manifest's files for it, replacing its earlier claims, unless another manifest owns a path.

    # Raises: ClaimConflict, ClaimsUnknown (nothing claimed), StorageFault (the claims cannot be written).
    """
    mine = _Mine(manifest)
    roots = _roots(mine)
    _refuse_another_of_this_name(mine)
    while True:
        with _locked(roots):
            found = _roots(mine)  # a root nested on the way may have appeared before its lock was taken
            if found <= roots:
                _refuse_taken(mine, found)
                storage.write_json(claims_path(mine.root, manifest.name), {
                    "format": CLAIMS_FORMAT, "manifest": {"path": manifest.path, "name": manifest.name},
                    "files": mine.files,
                })
                return
        roots |= found


@dataclass
class _Mine:
    """What one manifest writes: its files relative to its real root, and every path it writes by owner job."""

    root: Path  # real
    name: str
    path: str  # the manifest's file
    files: dict[str, str]  # relative file -> job key (what claims.json holds)
    written: dict[str, str]  # real path of each file and its sidecar -> job key

    def __init__(self, manifest):
        self.root = Path(manifest.output_root).resolve()
        self.name = manifest.name
        self.path = manifest.path
        self.files = wanted(manifest)
        self.written = dict(_written((os.path.join(self.root, f), key) for f, key in self.files.items()))

    def shown(self, path: str) -> str:
        root = f"{self.root}{os.sep}"
        return path[len(root):] if path.startswith(root) else path


# Paths are compared as plain strings, real and normalised: 10,000 jobs' paths and their folders are hashed and
# walked up many times, which pathlib's objects make several times slower.
def _written(files: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Each file with its owner, and the sidecar `publish` writes beside it."""
    for path, owner in files:
        yield path, owner
        yield f"{path}.json", owner  # storage.sidecar_path


def _parents(path: str) -> Iterator[str]:
    """`/a/b/c` -> `/a/b`, `/a`, `/`."""
    while (parent := os.path.dirname(path)) != path:
        yield parent
        path = parent


@contextlib.contextmanager
def _locked(roots: Iterable[Path]) -> Iterator[None]:
    """The claims lock of every root, taken in path order (two submits never wait on each other in a circle); each
    lock is released when its descriptor closes, also if this process dies."""
    with contextlib.ExitStack() as stack:
        for root in sorted(roots):
            path = root / storage.RECORDS_DIR / LOCK_FILE
            try:
                path.parent.mkdir(exist_ok=True)
                stack.enter_context(filelock.FileLock(path))  # flock; never opened through a link
            except OSError as err:
                raise StorageFault(f"cannot take the claims lock {path}: {err.strerror or err} (it must be a file "
                                   "the farm made; if it is a link, a folder or a special file, remove it)") from err
        yield


def _roots(mine: _Mine) -> set[Path]:
    """Every root whose paths can meet the manifest's: its own, each folder above it holding `.farm/`, and each
    folder holding `.farm/` on the way from it to one of its paths (the path itself included)."""
    found = {mine.root} | {p for p in mine.root.parents if _is_root(str(p))}
    root, seen = str(mine.root), set()
    for path in mine.written:
        while path != root and path not in seen:
            seen.add(path)
            if _is_root(path):
                found.add(Path(path))
            path = os.path.dirname(path)
    return found


def _is_root(folder: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(os.path.join(folder, storage.RECORDS_DIR)).st_mode)
    except OSError:
        return False


def _refuse_another_of_this_name(mine: _Mine) -> None:
    """The records of the manifest's name in its root must be its own: another manifest of that name would take over
    its claims (a submit rewrites them) and overwrite its renders. Whose they are is read from the claims, else from
    the state, as another manifest's files are; when neither can be read, the name alone tells (so the fix a
    refusal names, that manifest's own submit, works).

    # Raises: ClaimConflict naming the other manifest's file and the fix.
    """
    folder = mine.root / storage.RECORDS_DIR / mine.name
    try:
        _, recorded = _records_files(mine.root, folder)
    except ClaimsUnknown:
        return
    if recorded.get("path") not in (None, mine.path):
        raise ClaimConflict(f"{mine.root} already holds the renders of another manifest named {mine.name!r} "
                            f"({recorded['path']}); two manifests with one name would overwrite each other's "
                            f"renders: change name: (or, if the manifest moved, remove {folder}/: its renders stay "
                            f"done, as their sidecars say)")


def _refuse_taken(mine: _Mine, roots: set[Path]) -> None:
    theirs: dict[str, str] = {}
    for root in sorted(roots):
        theirs |= _claimed(root, skip=mine.name if root == mine.root else None)
    taken = _overlaps(mine, theirs)
    if taken:
        shown = "\n  ".join(taken[:_SHOWN]) + (f"\n  ... and {len(taken) - _SHOWN} more" if len(taken) > _SHOWN else "")
        raise ClaimConflict(
            f"{len(taken)} output path(s) of {mine.name} in {mine.root} belong to another manifest; "
            f"writing them would overwrite its renders:\n  {shown}\n"
            f"give this manifest another output.root or output.path, or, if the other manifest is retired, remove "
            f"its records ({storage.RECORDS_DIR}/<its name>/)")


def _overlaps(mine: _Mine, theirs: dict[str, str]) -> list[str]:
    """Each path of `mine` that is a path of `theirs` (path -> owner), a folder above one, or below one."""
    folders: dict[str, str] = {}  # every folder above a path of theirs -> that path
    for path in theirs:
        for parent in _parents(path):
            if parent in folders:
                break  # its own parents are there too
            folders[parent] = path
    inside: dict[str, str | None] = {}  # a folder -> the path of theirs it is or lies inside (None: none)

    def above(folder: str) -> str | None:
        if folder not in inside:
            parent = os.path.dirname(folder)
            inside[folder] = folder if folder in theirs else None if parent == folder else above(parent)
        return inside[folder]

    taken = []
    for path, key in mine.written.items():
        if path in theirs:
            taken.append(f"{mine.shown(path)} (job {key}) is already written by {theirs[path]}")
        elif path in folders:
            below = folders[path]
            taken.append(f"{mine.shown(path)} (job {key}) is a folder of {mine.shown(below)}, written by "
                         f"{theirs[below]}")
        elif (outer := above(os.path.dirname(path))) is not None:
            taken.append(f"{mine.shown(path)} (job {key}) lies inside {mine.shown(outer)}, which is written by "
                         f"{theirs[outer]}")
    return sorted(taken)


def _claimed(root: Path, skip: str | None) -> dict[str, str]:
    """Every path the manifests of `root` own (their files, sidecars and the records folder itself) -> its owner
    in words; the manifest named `skip` left out.

    # Raises: ClaimsUnknown (a manifest's claims cannot be read), StorageFault (the records cannot be listed).
    """
    records = root / storage.RECORDS_DIR
    where = "" if skip is not None else f" in output root {root}"
    owned = {str(records): f"the farm's records of output root {root}"}
    try:
        entries = sorted(os.scandir(records), key=lambda e: e.name)
    except FileNotFoundError:
        return owned
    except OSError as err:
        raise StorageFault(f"cannot list {records}: {err.strerror or err}; the files its manifests claim are unknown "
                           "(fix its permissions)") from err
    for entry in entries:
        if entry.name.startswith(".") or entry.name == skip:
            continue  # the lock and other hidden files: no manifest is named so
        folder = Path(entry.path)
        if not entry.is_dir(follow_symlinks=False):
            raise ClaimsUnknown(f"{folder} is not a records folder the farm made (a link or a file), so the files "
                                f"it stands for are unknown; remove it")
        files, manifest = _records_files(root, folder)
        owner = f"manifest {manifest.get('name', entry.name)!r} ({manifest.get('path', 'path unknown')}){where}"
        owned |= dict(_written((path, f"job {key} of {owner}") for path, key in files))
    return owned


def _records_files(root: Path, folder: Path) -> tuple[list[tuple[str, str]], dict]:
    """The real paths of the files a manifest's records say it writes, with their job keys, and its manifest entry
    (path, name): from its claims, else from its state; none when its folder holds nothing but a lease.

    # Raises: ClaimsUnknown naming both records and the fix.
    """
    record, claims_problem = storage.read_record(folder / CLAIMS_FILE)
    files = record.get("files") if record is not None else None
    if isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return [(os.path.normpath(os.path.join(root, rel)), key) for rel, key in files.items()], _manifest_entry(record)
    claims_problem = claims_problem or (f"{folder / CLAIMS_FILE} " + (
        "is missing" if record is None else "is not a claims record (no mapping of files)"))
    state = storage.read_state(root, folder.name)
    if state is not None and "unreadable" not in state and "damaged" not in state:
        return ([(_real(path), key) for key, entry in state["jobs"].items() for path in storage.state_files(entry)],
                _manifest_entry(state))
    if state is None and _holds_nothing(folder):
        return [], {}
    state_problem = "missing" if state is None else state.get("unreadable") or state.get("damaged")
    raise ClaimsUnknown(
        f"{claims_problem}; and the manifest's state cannot stand in for it "
        f"({storage.state_path(root, folder.name)}: {state_problem}): the files manifest {folder.name!r} writes "
        f"are unknown, so no manifest of {root} may claim any until they are known again; run farm submit of "
        f"manifest {folder.name!r} to write its claims again, or, if it is retired, remove {folder}/")


def _manifest_entry(record: dict) -> dict:
    entry = record.get("manifest")
    return {k: v for k, v in entry.items() if isinstance(v, str)} if isinstance(entry, dict) else {}


def _real(path: str) -> str:
    """A recorded file where it is really written (its folders' symlinks resolved, as `wanted` resolves)."""
    folder, name = os.path.split(path)
    return os.path.join(os.path.realpath(folder), name)


def _holds_nothing(folder: Path) -> bool:
    """A records folder with no record but a lease (and temp files): a driver between taking its lease and writing
    its claims (which it writes under the lock, after the claims read here), or one that stopped there."""
    try:
        return all(name == lease.LEASE_FILE or name.startswith(".") for name in os.listdir(folder))  # "." : temps
    except OSError:
        return False
