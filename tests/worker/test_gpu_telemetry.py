"""A render's GPU telemetry: figures from scripted NVML readings, the sampling thread, and a real GPU's."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import structlog.testing

from worker import gpu_telemetry
from worker.gpu_telemetry import NvmlDevice, Sampler


class ScriptedDevice:
    """Readings from a script of (clock MHz, power W, reason bits); ``fail_at``: the clock read that raises."""

    def __init__(self, script, fail_at=None, limit=700.0):
        self.script, self.fail_at, self.limit = list(script), fail_at, limit
        self.reads = 0
        self.read_enough = threading.Event()  # set once the script has been read through (or the failing read)
        self._row = None

    def sm_clock_mhz(self):
        if self.reads == self.fail_at:
            self.read_enough.set()
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        self._row = self.script[min(self.reads, len(self.script) - 1)]
        self.reads += 1
        if self.reads >= len(self.script):
            self.read_enough.set()
        return self._row[0]

    def power_w(self):
        return self._row[1]

    def power_limit_w(self):
        return self.limit

    def clock_reasons(self):
        return self._row[2]


def test_the_figures_of_a_power_capped_render():
    # 4 samples: two at the cap (0x4), one braked (0x80) and hot (0x40), one idle (0x1: not power, not heat)
    device = ScriptedDevice([(1400, 690.0, 0x4), (1500, 680.0, 0x4), (1200, 700.0, 0x80 | 0x40), (1980, 130.0, 0x1)])
    sampler = Sampler(device)
    for _ in range(4):
        sampler.sample()
    assert sampler.summary() == {"samples": 4, "sm_clock_mhz_median": 1450.0, "sm_clock_mhz_min": 1200,
                                 "power_w_mean": 550.0, "power_limit_w": 700.0,
                                 "power_capped_share": 0.75, "thermal_share": 0.25}


def test_the_thread_samples_until_the_render_ends():
    device = ScriptedDevice([(1980, 120.0, 0)] * 3)
    with Sampler(device, period=0.001) as sampler:
        assert device.read_enough.wait(60)  # the render lasts at least three readings
    figures = sampler.summary()
    assert figures["samples"] >= 3 and figures["sm_clock_mhz_median"] == 1980 and figures["power_limit_w"] == 700.0
    assert figures["power_capped_share"] == 0 and figures["thermal_share"] == 0


def test_each_reading_reaches_the_dashboards_gauges_as_it_comes():
    device = ScriptedDevice([(1605, 690.0, 0x4), (1590, 700.0, 0x4), (1980, 120.0, 0)])
    seen = []
    sampler = Sampler(device, on_sample=lambda clock, power: seen.append((clock, power)))
    for _ in range(3):
        sampler.sample()
    assert seen == [(1605, 690.0), (1590, 700.0), (1980, 120.0)]


def test_a_failing_reading_ends_the_sampling_never_the_job():
    device = ScriptedDevice([(1500, 600.0, 0x4)] * 5, fail_at=2)
    with structlog.testing.capture_logs() as logs:
        with Sampler(device, period=0.001) as sampler:
            assert device.read_enough.wait(60)  # the render outlasts the failing read
    assert sampler.summary()["samples"] == 2  # the two readings before the failure are kept
    assert [entry["event"] for entry in logs] == ["gpu_telemetry_stopped"]
    assert "NVML_ERROR_GPU_IS_LOST" in logs[0]["reason"]


def test_without_a_device_nothing_is_sampled_and_every_figure_is_null():
    with Sampler(None) as sampler:
        pass
    assert sampler.summary() == dict.fromkeys(("samples", "sm_clock_mhz_median", "sm_clock_mhz_min", "power_w_mean",
                                               "power_limit_w", "power_capped_share", "thermal_share"))


def _fake_pynvml(init_error=None):
    handles = {}
    nvml = types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        nvmlInit=lambda: (_ for _ in ()).throw(init_error) if init_error else None,
        nvmlDeviceGetHandleByUUID=lambda uuid: handles.setdefault(uuid, object()),
        nvmlDeviceGetClockInfo=lambda handle, clock: 1755 if clock == 1 else 0,
        nvmlDeviceGetPowerUsage=lambda handle: 612_345,  # mW
        nvmlDeviceGetEnforcedPowerLimit=lambda handle: 700_000,
        nvmlDeviceGetCurrentClocksEventReasons=lambda handle: 0x4,
    )
    return nvml, handles


@pytest.mark.parametrize("uuid", ["GPU-0f1e2d3c-aaaa-bbbb-cccc-123456789abc", "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"])
def test_nvml_finds_the_gpu_by_the_uuid_cuda_reports(uuid):
    nvml, handles = _fake_pynvml()
    device = NvmlDevice(nvml, uuid)
    assert list(handles) == ["GPU-0f1e2d3c-aaaa-bbbb-cccc-123456789abc"]  # NVML's spelling: with the prefix
    assert (device.sm_clock_mhz(), device.power_w(), device.power_limit_w(), device.clock_reasons()) == \
        (1755.0, 612.345, 700.0, 4)


def test_a_node_without_nvml_renders_with_null_telemetry_and_says_how_to_get_it(monkeypatch):
    nvml, _ = _fake_pynvml(init_error=OSError("NVML Shared Library Not Found"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with structlog.testing.capture_logs() as logs:
        assert gpu_telemetry.open_device("GPU-0") is None
    assert logs[0]["event"] == "gpu_telemetry_unavailable" and "Shared Library Not Found" in logs[0]["reason"]
    assert "nvidia-ml-py" in logs[0]["fix"]


@pytest.mark.gpu
def test_a_real_gpu_reports_its_clock_and_power_while_it_works():
    import torch

    device = gpu_telemetry.open_device(str(torch.cuda.get_device_properties(0).uuid))
    assert device is not None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with Sampler(device, period=0.01) as sampler:
        for _ in range(1000):  # work until five samples are in; a sampler that stopped fails below, not hangs
            if (sampler.summary()["samples"] or 0) >= 5:
                break
            for _ in range(20):
                a = torch.tanh(a @ a)
            torch.cuda.synchronize()
    figures = sampler.summary()
    assert figures["samples"] >= 5
    assert 100 < figures["sm_clock_mhz_min"] <= figures["sm_clock_mhz_median"] < 5000
    assert 0 < figures["power_w_mean"] and 0 < figures["power_limit_w"] < 5000
