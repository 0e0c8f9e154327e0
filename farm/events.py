"""What a run tells people and leaves behind: structlog lines, a progress bar, and a JSONL event log.

The event log lives on shared storage (`<output.root>/.farm/<manifest>/events.jsonl`), one JSON object
a line, appended by the driver only, so it outlives the cluster and the dashboard.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

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


class RunLog:
    """One run's events: appended to the JSONL log, logged, and counted on the progress bar."""

    def __init__(self, path: Path, run_id: str, total: int, *, progress: bool = True):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self._file = open(path, "a", buffering=1)  # line-buffered: each event reaches storage when emitted
        self._log = structlog.get_logger("farm").bind(run=run_id)
        # disable=None turns the bar off when stderr is not a terminal (CI logs, `ray job submit`).
        self._bar = tqdm(total=total, unit="job", disable=None if progress else True, file=sys.stderr,
                         dynamic_ncols=True)
        self._failed = 0

    def emit(self, event: str, **fields: Any) -> None:
        record = {"ts": time.time(), "run": self.run_id, "event": event, **fields}
        self._file.write(json.dumps(record, default=str) + "\n")
        (self._log.warning if event in _WARNINGS else self._log.info)(event, **fields)
        if event in _FINAL:
            self._failed += event == "job_failed"
            self._bar.update(1)
            self._bar.set_postfix(failed=self._failed, refresh=False)

    def close(self) -> None:
        self._bar.close()
        self._file.close()
