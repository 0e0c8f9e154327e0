"""What the GPU's clock did while a job rendered: SM clock, power draw, and what held the clock down.

A render's seconds depend on the chip as well as the code. An H200 rendering a still sits at its 700 W cap with its
SM clock near 1,635 MHz instead of 1,980 (FP8 GEMM loops: ~1,400), two H200s have run the same still up to 2.6%
apart, and a node held down by heat or a lowered power limit is slower still
(benchmarks/results/h200-render.md). Every sidecar therefore says how this render's GPU ran, read
through NVML on a thread every ``PERIOD`` seconds while the job renders; a worker without NVML (a CPU worker, a
fake) writes nulls.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

# Every sidecar carries these keys (None where nothing was sampled). Shares are of the samples: how often NVML
# named the power cap (or the power brake), or a thermal slowdown, as a reason the clock was below its maximum.
FIELDS = ("samples", "sm_clock_mhz_median", "sm_clock_mhz_min", "power_w_mean", "power_limit_w",
          "power_capped_share", "thermal_share")
PERIOD = 0.05  # seconds between samples: ~30 over a 1.5 s still
# NVML's clock-event reason bits (nvmlClocksEventReason*), spelled out so the summary needs no pynvml to read
POWER_REASONS = 0x04 | 0x80  # SW power cap, HW power brake
THERMAL_REASONS = 0x20 | 0x40  # SW thermal slowdown, HW thermal slowdown


class Device(Protocol):
    """One GPU's readings (``NvmlDevice`` on a worker; tests pass their own)."""

    def sm_clock_mhz(self) -> float: ...
    def power_w(self) -> float: ...
    def power_limit_w(self) -> float: ...
    def clock_reasons(self) -> int: ...


class NvmlDevice:
    """A GPU found through NVML by its UUID (the one CUDA reports, so it is this worker's GPU whatever
    CUDA_VISIBLE_DEVICES renumbered)."""

    def __init__(self, nvml: Any, uuid: str):
        self._nvml = nvml
        self._handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")

    def sm_clock_mhz(self) -> float:
        return float(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))

    def power_w(self) -> float:
        return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3  # mW

    def power_limit_w(self) -> float:
        return self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1e3

    def clock_reasons(self) -> int:
        return int(self._nvml.nvmlDeviceGetCurrentClocksEventReasons(self._handle))


def open_device(uuid: str) -> NvmlDevice | None:
    """This GPU through NVML, or None (logged once) where NVML cannot be used: its sidecars then carry nulls."""
    try:
        import pynvml  # nvidia-ml-py, NVIDIA's own NVML binding

        pynvml.nvmlInit()
        return NvmlDevice(pynvml, uuid)
    except Exception as err:  # noqa: BLE001 - no NVML is a node without telemetry, not a worker that cannot render
        log.warning("gpu_telemetry_unavailable", reason=f"{type(err).__name__}: {err}",
                    fix="install nvidia-ml-py and run where the NVIDIA driver's libnvidia-ml is found")
        return None


class Sampler:
    """Samples ``device`` every ``period`` seconds on its own thread between ``with`` entry and exit; ``summary``
    then has the figures, and ``on_sample(clock MHz, power W)`` sees each reading as it comes (the dashboard's
    gauges). A reading that fails ends the sampling (logged) and never the job. With no device (no NVML, no GPU)
    it samples nothing and its figures are nulls."""

    def __init__(self, device: Device | None, period: float = PERIOD,
                 on_sample: Callable[[float, float], None] | None = None):
        self._device, self._period, self._on_sample = device, period, on_sample
        self._samples: list[tuple[float, float, int]] = []  # (SM clock MHz, power W, clock-event reason bits)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._limit: float | None = None

    def __enter__(self) -> Sampler:
        if self._device is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def sample(self) -> None:
        """One reading of clock, power and clock-event reasons (and, the first time, the power limit)."""
        device = self._device
        if self._limit is None:
            self._limit = device.power_limit_w()
        clock, power = device.sm_clock_mhz(), device.power_w()
        self._samples.append((clock, power, device.clock_reasons()))
        if self._on_sample is not None:
            self._on_sample(clock, power)

    def _run(self) -> None:
        try:
            while True:
                self.sample()
                if self._stop.wait(self._period):
                    return
        except Exception as err:  # noqa: BLE001 - telemetry is a figure of the job, never its failure
            log.warning("gpu_telemetry_stopped", reason=f"{type(err).__name__}: {err}", samples=len(self._samples))

    def summary(self) -> dict[str, Any]:
        """The sidecar's figures (see FIELDS); all None before the first sample."""
        samples = list(self._samples)  # the thread may still be appending
        if not samples:
            return dict.fromkeys(FIELDS)
        clocks, powers, reasons = zip(*samples, strict=True)
        n = len(samples)
        return {
            "samples": n,
            "sm_clock_mhz_median": statistics.median(clocks),
            "sm_clock_mhz_min": min(clocks),
            "power_w_mean": round(statistics.fmean(powers), 1),
            "power_limit_w": self._limit,
            "power_capped_share": round(sum(bool(r & POWER_REASONS) for r in reasons) / n, 3),
            "thermal_share": round(sum(bool(r & THERMAL_REASONS) for r in reasons) / n, 3),
        }
