"""Fixtures shared by the farm's tests: `farm` children and `ray start` clusters, each killed after the test."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.ray_nodes import RayNodes

REPO = Path(__file__).parents[2]


def _default_sigint() -> None:
    # A child inherits an ignored SIGINT (a background job of a non-interactive shell ignores it, and so would
    # every `farm submit` it starts); the interrupted-run test relies on Ctrl-C's default, so it sets it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def farm() -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts `farm` commands as children; whatever a test left running is killed when it ends, passed or not, so
    a driver that missed its signal never keeps the module cluster's GPUs from the next test."""
    started: list[subprocess.Popen] = []

    def start(*args: str, pipeline: str = "worker.fake:factory", env: dict | None = None,
              output: int = subprocess.PIPE) -> subprocess.Popen:
        command = [sys.executable, "-m", "farm", *args, "--pipeline", pipeline, "--no-progress"]
        child = subprocess.Popen(command, cwd=REPO, stdout=output, stderr=output, text=True, env=env,
                                 preexec_fn=_default_sigint)
        started.append(child)
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=60)


@pytest.fixture
def nodes():
    """A cluster of `ray start` processes; the test starts its head and nodes, and all are killed after it,
    whatever it did."""
    cluster = RayNodes()
    try:
        yield cluster
    finally:
        cluster.stop()
