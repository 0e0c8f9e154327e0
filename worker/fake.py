"""A stand-in pipeline that sleeps instead of denoising and paints a flat colour per seed (and hums, on a
checkpoint with sound).

For trying a cluster's plumbing without model weights (`farm submit m.yaml --pipeline worker.fake:factory`),
for the scheduler benchmark and for tests. It honours the job's size, frames, fps and steps, so outputs,
sidecars and timings look like real ones, and it reads the checkpoint's request rules (scheduler and VAE
configs, no weights), so it refuses exactly the requests the real pipeline refuses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cosmos3.rules.request import RenderRequest, RequestRules, resolve
from farm.job import ModelSpec

if TYPE_CHECKING:  # the pipeline module imports torch, which the driver need not have
    from cosmos3.pipeline import FrameSink


@dataclass
class FakeOutput:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    fps: float
    timings: dict
    info: dict = field(default_factory=lambda: {"precision": "fake", "step_policy": None, "checkpoint": {}})
    memory: dict = field(default_factory=dict)  # no GPU: every memory figure is None in the sidecar
    sound: np.ndarray | None = None  # float32 [channels, N]
    sampling_rate: int | None = None


def paint(request: RenderRequest) -> np.ndarray:
    """Frames of one colour derived from the seed, so different seeds give different files."""
    colour = np.random.default_rng(request.seed).integers(0, 256, size=3, dtype=np.uint8)
    return np.broadcast_to(colour, (request.frames, request.height, request.width, 3)).copy()


def hum(samples: int, rate: int, channels: int) -> np.ndarray:
    """A 440 Hz tone of the clip's length for a checkpoint with sound: ``float32 [channels, samples]``."""
    tone = 0.3 * np.sin(2 * np.pi * 440.0 * np.arange(samples) / rate)
    return np.repeat(tone[None], channels, axis=0).astype(np.float32)


class FakeRenderer:
    """Checks each request with cosmos3's own rules, as the real pipeline does, so it refuses the same jobs."""

    device = "cpu"
    load_timings: dict = {}  # nothing is loaded: every worker-start figure is None in the sidecar

    def __init__(self, rules: RequestRules, seconds_per_step: float):
        self.rules, self.seconds_per_step = rules, seconds_per_step
        self.facts = {}  # no GPU, no kernels

    def warm_up(self) -> None:
        pass  # it loads and sets up nothing

    def __call__(self, request: RenderRequest, callback, frames: FrameSink | None = None) -> FakeOutput:
        plan = resolve(request, self.rules)  # raises PipelineError, as Cosmos3Pipeline does
        steps = []
        for step in range(plan.steps):
            start = time.perf_counter()
            time.sleep(self.seconds_per_step)
            callback(step, plan.steps)
            steps.append(time.perf_counter() - start)
        timings = {"vae_wait": None, "tokenize": 0.0, "vae_encode": None, "und": 0.0, "steps": steps, "vae_decode": 0.0,
                   "total": sum(steps)}
        output = FakeOutput(paint(plan), plan.fps, timings)
        if plan.sound_samples is not None:
            output.sampling_rate = self.rules.sound.config.sampling_rate
            output.sound = hum(plan.sound_samples, output.sampling_rate, self.rules.sound.config.channels)
        if frames is not None:  # handed on in chunks as the VAE decodes them: one frame, then temporal_factor each
            frames.start(output.frames.shape, output.fps, output.sound, output.sampling_rate)
            for start in range(0, len(output.frames), self.rules.temporal_factor):
                frames.write(output.frames[max(start - self.rules.temporal_factor + 1, 0):start + 1])
        return output


def factory(model: ModelSpec, gpu: bool, *, seconds_per_step: float = 0.01) -> FakeRenderer:
    """A `worker.actor.PipelineFactory`."""
    return FakeRenderer(RequestRules.from_checkpoint(model.checkpoint), seconds_per_step)
