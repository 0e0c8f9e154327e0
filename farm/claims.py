"""Who owns each output file of a root: one manifest per file, whatever the manifests' names.

Two manifests sharing `output.root` whose templates resolve to one file would overwrite each other's renders
(and each would then count the other's render as its own not done). So a manifest claims the files its jobs
publish: `<root>/.farm/<name>/claims.json` lists them, relative to the root, with the manifest's path. A file
claimed by another manifest is refused at validate, plan and submit, naming that manifest and its job.

A submit rewrites its claims (jobs removed from the manifest give their files back) under an exclusive lock on
`<root>/.farm/.claims.lock`, held from reading the others' claims to publishing its own, so of two submits
started at once only one can take a file. Validate and plan only read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import structlog

from farm import storage, template
from farm.errors import FarmError

CLAIMS_FILE = "claims.json"
LOCK_FILE = ".claims.lock"  # a dot first: no manifest name (an id starts with a letter or digit) is it
CLAIMS_FORMAT = 1
log = structlog.get_logger("farm")


class ClaimConflict(FarmError):
    """Files of this manifest are another manifest's."""


def claims_path(root: str | Path, name: str) -> Path:
    return storage.records_dir(root, name) / CLAIMS_FILE


def wanted(manifest) -> dict[str, str]:
    """Every file the manifest's jobs publish, where it is really written (its folders' symlinks resolved, as
    publishing follows them), relative to its root -> the job's key."""
    real_root = Path(manifest.output_root).resolve()
    return {str(template.check_target(manifest.output_root, path, storage.RECORDS_DIR).relative_to(real_root)): job.key
            for job in manifest.jobs for path in job.files}


def check(manifest) -> None:
    """Refuses a manifest whose files another manifest of its root has claimed (a read; nothing is written).

    # Raises: ClaimConflict naming, for the first files taken, the other manifest and its job.
    """
    _refuse_taken(manifest, wanted(manifest))


def claim(manifest) -> None:
    """Claims the manifest's files for it, replacing its earlier claims, unless another manifest holds one.

    # Raises: ClaimConflict (nothing claimed), StorageFault (the claims cannot be written).
    """
    files = wanted(manifest)
    with _locked(manifest.output_root):
        _refuse_taken(manifest, files)
        storage.write_json(claims_path(manifest.output_root, manifest.name), {
            "format": CLAIMS_FORMAT, "manifest": {"path": manifest.path, "name": manifest.name}, "files": files,
        })


@contextlib.contextmanager
def _locked(root: str | Path) -> Iterator[None]:
    path = Path(root) / storage.RECORDS_DIR / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes, also if this process dies
        yield
    finally:
        os.close(fd)


def _refuse_taken(manifest, files: dict[str, str]) -> None:
    taken = []
    for other, record in _others(manifest):
        theirs = record.get("files")
        if not isinstance(theirs, dict):
            continue
        owner = record.get("manifest") if isinstance(record.get("manifest"), dict) else {}
        for relative in files.keys() & theirs.keys():
            taken.append(f"{relative} (job {files[relative]}) is already written by job {theirs[relative]} of "
                         f"manifest {owner.get('name', other)!r} ({owner.get('path', 'path unknown')})")
    if taken:
        shown = "\n  ".join(sorted(taken)[:10]) + (f"\n  ... and {len(taken) - 10} more" if len(taken) > 10 else "")
        raise ClaimConflict(
            f"{len(taken)} output file(s) of {manifest.name} in {manifest.output_root} belong to another manifest; "
            f"writing them would overwrite its renders:\n  {shown}\n"
            f"give this manifest another output.root or output.path, or, if the other manifest is retired, remove "
            f"its records ({storage.RECORDS_DIR}/<its name>/)")


def _others(manifest) -> Iterator[tuple[str, dict]]:
    """(name, claims) of every other manifest of the root. The records of this name are this manifest's (a
    manifest that moved keeps its files; another one of the same name is refused at submit, `driver`)."""
    for path in sorted((Path(manifest.output_root) / storage.RECORDS_DIR).glob(f"*/{CLAIMS_FILE}")):
        if path.parent.name == manifest.name:
            continue
        record, problem = storage.read_record(path)
        if problem:
            log.warning("claims_unreadable", problem=problem)
        if record is not None:
            yield path.parent.name, record
