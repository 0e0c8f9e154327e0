"""A stand-in pipeline that sleeps instead of denoising and paints a flat colour per seed.

For trying a cluster's plumbing without model weights (`farm submit m.yaml --pipeline worker.fake:factory`),
for the scheduler benchmark and for tests. It honours the job's size, frames, fps and steps, so outputs,
sidecars and timings look like real ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farm.manifest import ModelSpec


@dataclass
class FakeOutput:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    fps: float
    timings: dict
    info: dict = field(default_factory=lambda: {"precision": "fake", "step_policy": None, "checkpoint": {}})
    memory: dict = field(default_factory=dict)  # no GPU: every memory figure is None in the sidecar


def paint(request: dict[str, Any]) -> np.ndarray:
    """Frames of one colour derived from the seed, so different seeds give different files."""
    colour = np.random.default_rng(request["seed"]).integers(0, 256, size=3, dtype=np.uint8)
    shape = (request["frames"], request["height"], request["width"], 3)
    return np.broadcast_to(colour, shape).copy()


class FakeRenderer:
    device = "cpu"
    load_timings: dict = {}  # nothing is loaded: every worker-start figure is None in the sidecar

    def __init__(self, seconds_per_step: float):
        self.seconds_per_step = seconds_per_step
        self.facts = {}  # no GPU, no kernels

    def __call__(self, request: dict[str, Any], callback) -> FakeOutput:
        steps = []
        for step in range(request["steps"]):
            start = time.perf_counter()
            time.sleep(self.seconds_per_step)
            callback(step, request["steps"])
            steps.append(time.perf_counter() - start)
        timings = {"tokenize": 0.0, "vae_encode": None, "und": 0.0, "steps": steps, "vae_decode": 0.0, "total": sum(steps)}
        return FakeOutput(paint(request), request["fps"], timings)


def factory(model: ModelSpec, gpu: bool, *, seconds_per_step: float = 0.01) -> FakeRenderer:
    """A `worker.actor.PipelineFactory`."""
    return FakeRenderer(seconds_per_step)
