"""How a checkpoint's files are opened: as bounded regular files.

A link is followed (a hub cache's snapshot links to its blobs), but what it reaches must be a regular file, and it
is opened without blocking, so a FIFO or a link to /dev/zero at a config, the tokenizer or the index is refused with
its path instead of hanging the read or filling memory; a JSON file is read up to JSON_LIMIT bytes at most.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

from cosmos3.errors import CheckpointError
from cosmos3.rules import json_text

JSON_LIMIT = 64 << 20  # bytes of any JSON file of a checkpoint (a large tokenizer.json is ~10 MB)


def open_file(path: Path) -> IO[bytes]:
    """`path` opened for reading when what it is (or links to) is a regular file; never blocks on a FIFO.

    # Raises: FileNotFoundError; CheckpointError naming the path (not a regular file, or unreadable).
    """
    try:
        handle = open(path, "rb", opener=lambda p, _: os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except FileNotFoundError:
        raise
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({errno.errorcode.get(err.errno, err.errno)}: "
                              f"{err.strerror})") from None
    mode = os.fstat(handle.fileno()).st_mode
    if not stat.S_ISREG(mode):
        handle.close()
        raise CheckpointError(f"{path}: is {_kind(mode)}, not a file of the checkpoint (replace it with the "
                              "published file)")
    return handle


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a folder" if stat.S_ISDIR(mode) else "not a regular file"


def read_bounded(path: Path, limit: int = JSON_LIMIT) -> bytes:
    """The bytes of the regular file `path`, refused beyond `limit`.

    # Raises: FileNotFoundError; CheckpointError naming the path.
    """
    with open_file(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise CheckpointError(f"{path}: larger than {limit >> 20} MiB, not a JSON file of a checkpoint")
    return data


def read_json(path: Path, missing: str, error: type[CheckpointError] | Any = CheckpointError) -> Any:
    """The JSON value in `path`, read as a bounded regular file; `error` (CheckpointError or ConfigError) naming the
    file when it is absent (`missing` says what it is for), not a regular file, too large or not JSON."""
    try:
        data = read_bounded(path)
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except CheckpointError as err:
        raise error(str(err)) from None
    try:
        return json_text.loads(data)
    except ValueError as err:  # also UnicodeDecodeError
        raise error(f"{path}: not valid JSON ({err})") from None
