"""The denoising loop's scheduler: a diffusers scheduler built from the checkpoint's recipe
(``cosmos3.rules.sampling``), and one update of the latents."""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING

from cosmos3.library_import import LIBRARY_IMPORT
from cosmos3.rules.sampling import SamplingRecipe

if TYPE_CHECKING:
    import torch


def _init_kwargs(cls, config: dict) -> dict:
    # Drop keys the class does not take (t_list, _class_name, ...) so diffusers does not warn per job.
    accepted = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in config.items() if k in accepted}


def make_scheduler(recipe: SamplingRecipe, *, steps: int, flow_shift: float | None, device: torch.device):
    """A fresh scheduler with its timesteps set; schedulers are stateful, so one per job."""
    with LIBRARY_IMPORT:  # a first job's steps run beside a background VAE build's import
        from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    if recipe.is_distilled:
        scheduler = FlowMatchEulerDiscreteScheduler(**_init_kwargs(FlowMatchEulerDiscreteScheduler, recipe.config))
        scheduler.set_timesteps(sigmas=list(recipe.fixed_sigmas), device=device)
        return scheduler
    kwargs = _init_kwargs(UniPCMultistepScheduler, recipe.config)
    kwargs.update(flow_shift=flow_shift, use_karras_sigmas=False)
    scheduler = UniPCMultistepScheduler(**kwargs)
    scheduler.set_timesteps(steps, device=device)
    # diffusers keeps UniPC's sigmas on the CPU and copies each one a step uses to the device: a blocking copy
    # that waits for the GPU's queue to drain, several times a step. On the device, a step queues behind the
    # forwards instead (FlowMatchEuler already keeps its sigmas on the device).
    scheduler.sigmas = scheduler.sigmas.to(device)
    return scheduler


def scheduler_step(
    scheduler, velocity: torch.Tensor, t: torch.Tensor, latents: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """One update of ``latents [C, T, H, W]``; the schedulers' einsums want a batch axis. Queued without waiting
    for the device (``_unchecked_solve``)."""
    kwargs = {"generator": generator} if scheduler.config.get("stochastic_sampling") else {}
    with _unchecked_solve()():
        out = scheduler.step(velocity.unsqueeze(0), t, latents.unsqueeze(0), return_dict=False, **kwargs)
    return out[0].squeeze(0)


@functools.cache
def _unchecked_solve() -> type:
    """A torch function mode (its ``with`` holds for this thread only) that runs ``torch.linalg.solve`` without its
    error check.

    UniPC's corrector solves an ``order x order`` system on the device every step, and the check reads the
    factorization's status back to the host: the host waits for the GPU to drain, then the GPU idles while the
    host launches the rest of the step, ~50 small kernels (the largest GPU-idle gap of a graphed still's step on
    the H200: benchmarks/results/h200-render.md). Unchecked, the whole step queues behind the forwards. The system
    cannot be singular: it is a Vandermonde matrix in the ratios ``r_k`` of distinct log-SNR steps (distinct sigmas).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    class UncheckedSolve(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.linalg.solve:
                return torch.linalg.solve_ex(*args, **(kwargs or {}), check_errors=False).result
            return func(*args, **(kwargs or {}))

    return UncheckedSolve
