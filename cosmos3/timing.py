"""Honest per-stage figures of a render: device-synced wall time and peak GPU memory per stage.

Every field exists on every device; where a figure does not apply (GPU memory on a CPU worker) it is
None, so sidecars of CPU and GPU workers have one shape.
"""

from __future__ import annotations

import itertools
import time

import torch


class Clock:
    """Wall time that waits for queued device work, so a stage's time is its own and not the next one's."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    def __call__(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class StepTimes:
    """Per-step times that do not drain the device: on CUDA an event is queued at each step boundary, and a step's
    time is the device's, from the end of the previous step's work to the end of its own (idle time in between
    counts, as for wall time). A ``Clock`` between steps would drain the GPU's queue twice a step, and the GPU
    would then idle while Python launches the next step (about 1 ms a step of a graphed still on the H200:
    benchmarks/results/h200-render.md).
    """

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self._marks: list = []

    def mark(self) -> None:
        """A step boundary: once before the first step, then after each."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def wait(self, step: int) -> None:
        """Returns once step ``step`` (0-based) has run on the device."""
        if self.cuda:
            self._marks[step + 1].synchronize()

    def seconds(self) -> list[float]:
        """Each step's seconds (waits for the last mark)."""
        pairs = itertools.pairwise(self._marks)
        if self.cuda and self._marks:
            self._marks[-1].synchronize()
            return [start.elapsed_time(end) / 1e3 for start, end in pairs]
        return [end - start for start, end in pairs]


class MemoryProbe:
    """Peak ``torch.cuda.max_memory_allocated`` per stage, and the job's peak allocated and reserved bytes.

    ``start()`` at the job's start, ``mark(stage)`` after each stage, ``report()`` at the end.
    """

    STAGES = ("vae_encode", "und", "steps", "vae_decode")

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._stages: dict[str, int | None] = dict.fromkeys(self.STAGES)
        self._resident = self._reserved = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._resident = torch.cuda.memory_allocated(self.device)
            self._reserved = 0

    def mark(self, stage: str) -> None:
        if self.cuda:
            self._stages[stage] = torch.cuda.max_memory_allocated(self.device)
            self._reserved = max(self._reserved, torch.cuda.max_memory_reserved(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)  # the next stage's peak is its own

    def report(self) -> dict:
        peaks = [v for v in self._stages.values() if v is not None]
        return {
            "resident_bytes": self._resident,  # weights and caches held before the job started
            "peak_allocated_bytes": max(peaks) if peaks else None,
            "peak_reserved_bytes": self._reserved,
            "stage_peak_allocated_bytes": dict(self._stages),
        }
