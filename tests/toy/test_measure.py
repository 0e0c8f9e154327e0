"""The fidelity metrics every toy gate and benchmark compares renders with: PSNR of uint8 frames, SNR of waveforms,
each checked against figures worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from toy import measure

RATE = 8000  # Hz


def test_frames_five_levels_apart_everywhere_are_34_15_db_apart_either_way():
    """MSE 25, so PSNR = 10 log10(255² / 25) = 20 log10(51) = 34.151 dB, whichever frame is the reference: the
    difference must not wrap around in uint8 (5 - 10 is 251 there)."""
    dark = np.full((3, 4, 4, 3), 5, dtype=np.uint8)
    light = np.full((3, 4, 4, 3), 10, dtype=np.uint8)
    assert measure.mse(dark, light) == measure.mse(light, dark) == 25.0
    assert measure.psnr(dark, light) == measure.psnr(light, dark) == pytest.approx(34.151, abs=1e-3)


def test_one_level_off_in_one_pixel_of_four_is_mse_a_quarter():
    a = np.zeros((2, 2), dtype=np.uint8)
    b = a.copy()
    b[0, 0] = 1
    assert measure.mse(a, b) == 0.25
    assert measure.decibels(0.25) == pytest.approx(54.151, abs=1e-3)  # 10 log10(255² · 4)
    assert measure.decibels(1.0) == pytest.approx(48.131, abs=1e-3)  # 20 log10(255)


def test_identical_renders_are_infinitely_close():
    frames = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    sound = np.sin(np.linspace(0, 20, 400, dtype=np.float32))[None]
    assert measure.psnr(frames, frames.copy()) == float("inf")
    assert measure.decibels(0.0) == float("inf")
    assert measure.snr(sound, sound.copy()) == float("inf")


def test_a_unit_tone_with_noise_of_power_0_0025_is_23_01_db():
    """A unit sine over whole periods has power 1/2; a ±0.05 square noise power 0.0025: 10 log10(200) = 23.010 dB."""
    t = np.arange(RATE) / RATE  # one second: 400 whole periods of 400 Hz
    tone = np.sin(2 * np.pi * 400 * t).astype(np.float32)[None].repeat(2, 0)  # [2, N]
    noise = np.where(np.arange(RATE) % 2 == 0, 0.05, -0.05).astype(np.float32)
    assert measure.snr(tone, tone + noise) == pytest.approx(23.010, abs=1e-3)


def test_snr_is_measured_against_the_reference_power_not_the_signal_power():
    """Halving a tone leaves noise of a quarter of its power: 10 log10(4) = 6.02 dB; doubling it (the same error
    relative to the louder render) leaves noise equal to the reference's power: 0 dB."""
    t = np.arange(RATE) / RATE
    tone = np.sin(2 * np.pi * 400 * t)
    assert measure.snr(tone, tone / 2) == pytest.approx(6.021, abs=1e-3)
    assert measure.snr(tone, tone * 2) == pytest.approx(0.0, abs=1e-9)
