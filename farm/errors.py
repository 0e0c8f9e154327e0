"""Errors a user can cause. Each one's `str()` is the whole message, so the CLI prints it without a traceback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from farm import terminal


class FarmError(Exception):
    """Base class: something the user can fix (a manifest, a path, a cluster address)."""


@dataclass(frozen=True)
class Problem:
    """One manifest error: where it is and what rule it breaks."""

    line: int | None  # 1-based; None when the error is about the whole file
    where: str  # `jobs[2] (id=extend) -> size`
    message: str  # `1000 is not a multiple of 16`

    def render(self, filename: str) -> str:
        place = f"{filename}:{self.line}" if self.line else filename
        return f"{place}: {self.where}: {self.message}" if self.where else f"{place}: {self.message}"


class ManifestError(FarmError):
    """Every problem found in one manifest, reported together."""

    def __init__(self, path: Path | str, problems: list[Problem]):
        self.path = Path(path)
        # One bad value in `defaults` breaks every job inheriting it: report it once.
        self.problems = sorted(set(problems), key=lambda p: (p.line or 0, p.where, p.message))
        super().__init__(self._text())

    def _text(self) -> str:
        count, name = len(self.problems), terminal.escape(self.path.name)
        header = f"{count} error{'s' if count != 1 else ''} in {name}"
        return "\n".join([header, *(p.render(name) for p in self.problems)])


class ClusterError(FarmError):
    """The driver could not get workers: no cluster at the address, no GPUs of the asked type, none started."""


class StateError(FarmError):
    """An output root holds no farm records, or not the ones a command needs."""


class WorkerConfigError(FarmError):
    """A worker refuses to start because its node is not set up as the farm assigned it (e.g. GPU visibility)."""


class WorkerStartError(FarmError):
    """A worker's start failed after it reported ready: what its renderer loads in the background (the VAE) did
    not load, so it can render nothing. Raised from the job that found out; the job is not to blame."""


class StorageFault(FarmError):
    """Storage could not take a write: no space (ENOSPC), read-only, gone. The attempt fails; the worker that
    tried is not to blame, so it is not retired for it."""


class JobFault(FarmError):
    """A job's render ran out of memory (host or GPU) for the size it asks: its own request, not its worker. The
    attempt fails without counting against the worker."""


class InputChanged(FarmError):
    """A job's input (image, video) is no longer the file its config hash was made from: the job's, not its worker's;
    retrying cannot help until a new `farm submit` hashes the file as it is."""


class OutputPathError(FarmError):
    """A job's output path leads out of output.root (a symlink) or into the farm's records: the job's fault."""
