"""A BF16 tiny transformer and its static-FP8 export by ModelOpt, calibrated from real forward passes."""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos3.checkpoint.fp8_export import export, quantize
from cosmos3.diffusers_model import load_diffusers_transformer, reference_forward
from testbed.reference import tiny_reference

PROMPTS = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6]), torch.tensor([5, 3, 5, 8, 9, 7, 9])]


def calibration_inputs(seed: int = 0):
    """(input_ids, latents, timestep, fps) over a spread of noise levels and prompts."""
    g = torch.Generator().manual_seed(seed)
    for i, t in enumerate((999.0, 750.0, 500.0, 250.0, 10.0)):
        yield PROMPTS[i % len(PROMPTS)], torch.randn(4, 2, 4, 4, generator=g), t, 24.0


def calibrate(model) -> None:
    """ModelOpt's forward loop: diffusers' model, driven as its pipeline drives it."""
    dtype = model.proj_in.weight.dtype
    for ids, latents, t, fps in calibration_inputs():
        reference_forward(model, ids, latents.to(dtype), t, fps=fps)


def make_bf16(path: Path, **overrides) -> Path:
    model = tiny_reference(**overrides).to(torch.bfloat16)
    model.time_embedder.float()  # diffusers keeps it fp32 (_keep_in_fp32_modules); so do published files
    model.save_pretrained(path, safe_serialization=True)
    return path


def quantized(src: Path, *, recipe: str = "cosmos", exclude=()):
    """diffusers' model of ``src``, quantized by ModelOpt and calibrated (ready for ``export``)."""
    model = load_diffusers_transformer(src)
    quantize(model, calibrate, recipe=recipe, exclude=exclude)
    return model


def make_fp8(src: Path, dst: Path, *, recipe: str = "cosmos", exclude=(), step_policy=None,
             max_shard_size: str = "24KB") -> Path:
    """ModelOpt's export of ``src`` (small shards, so a scale may part from its weight)."""
    return export(quantized(src, recipe=recipe, exclude=exclude), dst, step_policy=step_policy,
                  max_shard_size=max_shard_size)
