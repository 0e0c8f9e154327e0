"""A component (the text tokenizer, the VAE, the sound tokenizer) built in a thread, beside the transformer's load.

Each starts with a library's import (transformers', diffusers': seconds; 12-17 s for the VAE on the H200 host).
The decoders are built on the CPU and moved to their device where a job first uses them (its decode; I2V/V2V's
encode for the VAE), so a pipeline is ready without them: their thread makes no CUDA call, as a first job may be
capturing CUDA graphs meanwhile and CUDA refuses other threads' allocations during a capture. What can be checked
without the library is checked by the caller before the build starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from cosmos3.errors import BackgroundLoadError

if TYPE_CHECKING:  # torch-free: the text tokenizer's module imports this one
    import torch

T = TypeVar("T")


class BackgroundBuild(Generic[T]):
    """``build()`` in a thread named ``name``; ``wait()`` blocks until it is built and, given a ``device``, moved
    there (``.to(device)``). ``seconds`` is the build's own duration, None until it has ended. A failed build
    raises at every ``wait`` and ``result``: ``failure(error)`` (a BackgroundLoadError naming what failed), or
    without ``failure`` the build's own error."""

    def __init__(self, build: Callable[[], T], *, name: str, device: torch.device | None = None,
                 failure: Callable[[Exception], BackgroundLoadError] | None = None):
        self.seconds: float | None = None
        self._device = device
        self._failure = failure
        self._value: T | None = None
        self._ready = False
        self._error: Exception | None = None
        self._done = threading.Event()
        # Not a daemon: the interpreter's exit waits for the build. A daemon thread still inside torch when the
        # process exits (a worker stopped right after its start, a script that only loads) aborted it with
        # "terminate called without an active exception" (exit status 134).
        threading.Thread(target=self._build, args=(build,), name=name, daemon=False).start()

    def _build(self, build: Callable[[], T]) -> None:
        started = time.perf_counter()
        try:
            self._value = build()
        except Exception as err:  # kept for result(), which raises it where the component is needed
            self._error = err
        finally:
            self.seconds = time.perf_counter() - started
            self._done.set()

    def raise_if_failed(self) -> None:
        """Raises the build's failure now if it has already failed; never waits."""
        if self._done.is_set():
            self._check()

    def wait(self) -> float:
        """Blocks until built (and on its device); returns the seconds that took here (0.0 once done)."""
        if self._ready:
            return 0.0
        started = time.perf_counter()
        self._done.wait()
        self._check()
        if self._device is not None:
            self._value.to(self._device)
        self._ready = True
        return time.perf_counter() - started

    def result(self) -> T:
        """The component (on its device), once built."""
        self.wait()
        return self._value

    def _check(self) -> None:
        if self._error is not None:
            if self._failure is None:
                raise self._error
            raise self._failure(self._error) from self._error
