"""A decoder (the video VAE, the sound tokenizer) built on the CPU in a thread, moved to its device where first used.

Neither is needed before a job's decode (I2V/V2V's encode for the VAE), and each starts with diffusers' import
(seconds; 12-17 s for the VAE on the H200 host), so a pipeline is ready without them. The thread makes no CUDA call:
a first job may be capturing CUDA graphs meanwhile, and CUDA refuses other threads' allocations during a capture.
What can be checked without diffusers is checked by the caller before the build starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import torch

from cosmos3.errors import BackgroundLoadError


class Movable(Protocol):
    def to(self, device: torch.device) -> Movable: ...


T = TypeVar("T", bound=Movable)


class BackgroundBuild(Generic[T]):
    """``build()`` (on the CPU) in a thread named ``name``; ``wait()`` blocks until it is built and on ``device``.
    ``seconds`` is the build's own duration, None until it has ended. A failed build raises ``failure(error)``
    (a BackgroundLoadError naming what failed) at every ``wait`` and ``result``."""

    def __init__(self, build: Callable[[], T], *, device: torch.device, name: str,
                 failure: Callable[[Exception], BackgroundLoadError]):
        self.seconds: float | None = None
        self._device = device
        self._failure = failure
        self._value: T | None = None
        self._on_device = False
        self._error: Exception | None = None
        self._done = threading.Event()
        threading.Thread(target=self._build, args=(build,), name=name, daemon=True).start()

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
        """Blocks until built and on its device; returns the seconds that took here (0.0 once done)."""
        if self._on_device:
            return 0.0
        started = time.perf_counter()
        self._done.wait()
        self._check()
        self._value.to(self._device)
        self._on_device = True
        return time.perf_counter() - started

    def result(self) -> T:
        """The component on its device, once built."""
        self.wait()
        return self._value

    def _check(self) -> None:
        if self._error is not None:
            raise self._failure(self._error) from self._error
