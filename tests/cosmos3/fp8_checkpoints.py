"""A BF16 tiny checkpoint and its static-FP8 export, calibrated from real forward passes."""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos3.fp8_export import export_static_fp8
from tests.cosmos3.reference import tiny_reference

PROMPTS = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6]), torch.tensor([5, 3, 5, 8, 9, 7, 9])]


def calibration_inputs(seed: int = 0):
    """(input_ids, latents, timestep, fps) over a spread of noise levels and prompts."""
    g = torch.Generator().manual_seed(seed)
    for i, t in enumerate((999.0, 750.0, 500.0, 250.0, 10.0)):
        yield PROMPTS[i % len(PROMPTS)], torch.randn(4, 2, 4, 4, generator=g), t, 24.0


def calibrate(model) -> None:
    for ids, latents, t, fps in calibration_inputs():
        model.velocity(ids, latents, t, fps=fps)


def make_bf16(path: Path, **overrides) -> Path:
    model = tiny_reference(**overrides).to(torch.bfloat16)
    model.time_embedder.float()  # diffusers keeps it fp32 (_keep_in_fp32_modules); so do published files
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_fp8(src: Path, dst: Path, **kwargs) -> Path:
    return export_static_fp8(src, dst, calibrate, num_shards=3, **kwargs)
