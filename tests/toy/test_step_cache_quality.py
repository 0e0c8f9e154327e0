"""SeaCache's quality gates on the committed toy checkpoint, on a subset of the demo's clips: with the default cache
against uncached, same job and seed, every render within MIN_PSNR, the median within MEDIAN_PSNR, each still
showing its prompt (``toy.measure``), and steps actually cached; its sound's SNR against the uncached sound at
least MIN_SOUND_SNR, the median at least MEDIAN_SOUND_SNR, each tone's pitch still naming its shape's colour
(benchmarks/bench_step_cache.py runs the whole demo set and the threshold sweep).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3.cache_options import DEFAULT_CACHE, parse_cache
from cosmos3.pipeline import Cosmos3Pipeline
from toy import measure, scenes
from toy.scenes import Scene

ROOT = Path(__file__).resolve().parents[2] / "checkpoints" / "toy" / "fp8"
CLIPS = [(Scene("square", "red", "white", motion="right"), 0), (Scene("triangle", "blue", "yellow", motion="up"), 0),
         (Scene("circle", "green", "blue", motion="left"), 2)]
MEDIAN_PSNR, MIN_PSNR = 30.0, 25.0  # dB; measured on these: 53.8 to 61.9 (cpu-step-cache.md)
# dB. Measured over the demo's 7 clips (cpu-step-cache.md): min 20.0 (blue-triangle-moving-up, 20.004), median 34.0;
# on these three 38.8, 20.0, 32.4. The project's bar for sound kept (FP8 against BF16, test_sound.py) is 20 dB, which
# the default clears by 0.004 dB on its worst clip: a bound there would fail on arithmetic noise, so the minimum is
# 3 dB under what was measured and the median, 4.4 dB under these clips', holds the rest. Threshold 0.4 fails both
# (min 14.1, median 18.5 on these).
MEDIAN_SOUND_SNR, MIN_SOUND_SNR = 28.0, 17.0


@pytest.fixture(scope="module")
def pipe():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/toy/test_renders.py: one thread is faster on shared CI cores
    yield Cosmos3Pipeline.from_pretrained(ROOT, cache="off")
    torch.set_num_threads(threads)


def test_the_default_cache_keeps_the_demo_clips_within_the_quality_gates(pipe):
    assert parse_cache(DEFAULT_CACHE) is not None, "the default caches clips"
    psnrs, snrs, cached = [], [], []
    for scene, seed in CLIPS:
        request = scenes.request(scene, seed=seed)
        pipe.cache = None
        uncached = pipe(request)
        pipe.cache = parse_cache(DEFAULT_CACHE)
        ours = pipe(request)
        assert measure.matches(scene, measure.read(ours.frames)), scene.caption
        heard = measure.colour_of_pitch(measure.pitch(ours.sound, ours.sampling_rate))
        assert heard == scene.colour, f"{scene.caption}: the cached render's sound names {heard}"
        psnrs.append(measure.psnr(ours.frames, uncached.frames))
        snrs.append(measure.snr(uncached.sound, ours.sound))
        cached.append(len(ours.info["cache"]["cached"]))
    print(f"\nPSNR (dB) {[round(v, 1) for v in psnrs]}, sound SNR (dB) {[round(v, 1) for v in snrs]}, "
          f"steps cached {cached} of {scenes.STEPS}")
    assert min(psnrs) >= MIN_PSNR and np.median(psnrs) >= MEDIAN_PSNR, psnrs
    assert min(snrs) >= MIN_SOUND_SNR and np.median(snrs) >= MEDIAN_SOUND_SNR, snrs
    assert min(cached) > 0, cached
