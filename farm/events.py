"""What a run tells people and leaves behind: structlog lines, a progress bar, and a JSONL event log.

The event log lives on shared storage (`<output.root>/.farm/<manifest>/events.jsonl`), one JSON object
a line, appended by the driver only, so it outlives the cluster and the dashboard.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

from farm import records

# Events that end a job: they move the progress bar.
_FINAL = {"job_done", "job_failed"}
# Events worth a warning in the console log.
_WARNINGS = {"job_failed", "job_retry", "job_timeout", "worker_lost", "worker_init_failed", "worker_retired",
             "worker_on_cpu", "node_lost"}


class _TqdmStream:
    """Routes log lines through tqdm so they print above the progress bar instead of breaking it."""

    def write(self, text: str) -> None:
        if text.strip():
            tqdm.write(text.rstrip("\n"), file=sys.stderr)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(json_lines: bool) -> None:
    """key=value lines for a terminal, or one JSON object a line (`--log-json`) for log collectors."""
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(file=_TqdmStream()),
        cache_logger_on_first_use=False,
    )


def _strict(value: Any) -> Any:
    """``value`` with each non-finite float as None: strict JSON readers (jq, JavaScript) refuse the ``NaN`` and
    ``Infinity`` Python writes, and one odd figure must not cost the event or the readers their log."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


class RunLog:
    """One run's events: appended to the JSONL log, logged, and counted on the progress bar."""

    def __init__(self, root: str | Path, name: str, run_id: str, total: int, *, progress: bool = True):
        """The events of manifest `name` under the output `root`: `.farm/NAME/events.jsonl`.

        # Raises: StorageFault naming the log, when it is not a file the farm can append to (`farm.records`).
        """
        self.run_id = run_id
        self.path = records.path(root, name, records.EVENTS_FILE)
        # Each event reaches storage when emitted, as one whole line (`_append`).
        self._fd = records.open_log(root, name, records.EVENTS_FILE)
        self._log = structlog.get_logger("farm").bind(run=run_id)
        # disable=None turns the bar off when stderr is not a terminal (CI logs, `ray job submit`).
        self._bar = tqdm(total=total, unit="job", disable=None if progress else True, file=sys.stderr,
                         dynamic_ncols=True)
        self._failed = 0
        self.fault: str | None = None  # why events could not be appended (a full disk), once one could not

    def emit(self, event: str, **fields: Any) -> None:
        record = {"ts": time.time(), "run": self.run_id, "event": event, **fields}
        self._append((json.dumps(_strict(record), default=str, allow_nan=False) + "\n").encode())
        (self._log.warning if event in _WARNINGS else self._log.info)(event, **fields)
        if event in _FINAL:
            self._failed += event == "job_failed"
            self._bar.update(1)
            self._bar.set_postfix(failed=self._failed, refresh=False)

    def _append(self, line: bytes) -> None:
        """Appends `line` whole or not at all: a write cut short (a full disk) is cut back off, so the log never
        holds half an event glued to the next run's first. The first failure is kept in `fault`; the scheduler
        then ends the run, since what it does could no longer be recorded."""
        size = os.fstat(self._fd).st_size  # the driver is the log's only writer
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"only {written} of {len(line)} bytes written")
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            if self.fault is None:
                code = errno.errorcode.get(err.errno, err.errno)
                self.fault = f"{code} ({err.strerror}) appending to {self.path}: events are no longer recorded"
                self._log.error("event_log_failed", error=self.fault)

    def close(self) -> None:
        self._bar.close()
        os.close(self._fd)
