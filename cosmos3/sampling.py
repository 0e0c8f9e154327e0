"""Samplers for the denoising loop, configured from the checkpoint's ``scheduler/`` (reference §4.2).

Two recipes exist, told apart by the scheduler config the checkpoint ships:

* base checkpoints: ``UniPCMultistepScheduler`` on flow sigmas (velocity prediction). The pipeline
  sets ``flow_shift`` per task (10 for video, 3 for images) and turns Karras spacing off, as the
  published docs do on top of the shipped config;
* distilled 4-step checkpoints: ``FlowMatchEulerDiscreteScheduler`` with ``stochastic_sampling`` on
  a fixed sigma list (``fixed_step_sampler_config.t_list``). Guidance is baked into the weights and
  every step re-noises with the request's generator.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cosmos3.checkpoint_files import read_json
from cosmos3.errors import CheckpointError
from cosmos3.library_import import LIBRARY_IMPORT

if TYPE_CHECKING:  # importable without torch, so the farm driver can check requests against a checkpoint
    import torch

UNIPC = "UniPCMultistepScheduler"
FLOW_MATCH_EULER = "FlowMatchEulerDiscreteScheduler"


@dataclass(frozen=True)
class SamplingRecipe:
    """What the checkpoint's scheduler config says about sampling; no scheduler state."""

    scheduler_class: str  # UNIPC or FLOW_MATCH_EULER
    config: dict  # scheduler_config.json as shipped
    fixed_sigmas: tuple[float, ...] | None = None  # distilled builds only

    @property
    def is_distilled(self) -> bool:
        return self.fixed_sigmas is not None

    @property
    def train_timesteps(self) -> int:
        """The timesteps the model was trained on (diffusers' default 1000): the most steps a schedule can hold."""
        return int(self.config.get("num_train_timesteps", 1000))


def _read_json(path: Path) -> dict:
    return read_json(path, "missing (the checkpoint needs it in the published layout)")


def _distilled_sigmas(config: dict, root: Path) -> tuple[float, ...] | None:
    """The fixed schedule: ``fixed_step_sampler_config.t_list``, else diffusers' ``distilled_sigmas``."""
    t_list = (config.get("fixed_step_sampler_config") or {}).get("t_list")
    if not t_list and (root / "modular_model_index.json").is_file():
        t_list = _read_json(root / "modular_model_index.json").get("distilled_sigmas")
    return tuple(float(s) for s in t_list) if t_list else None


def load_recipe(root: str | Path) -> SamplingRecipe:
    """Read ``<root>/scheduler/scheduler_config.json`` and refuse recipes we would sample wrongly."""
    root = Path(root)
    path = root / "scheduler" / "scheduler_config.json"
    config = _read_json(path)
    name = config.get("_class_name", UNIPC)
    sigmas = _distilled_sigmas(config, root)
    if name == UNIPC and sigmas is None:
        if config.get("prediction_type") != "flow_prediction" or not config.get("use_flow_sigmas"):
            raise CheckpointError(
                f"{path}: Cosmos3 predicts flow velocity; the UniPC config needs "
                f"prediction_type='flow_prediction' and use_flow_sigmas=true, got "
                f"prediction_type={config.get('prediction_type')!r}, use_flow_sigmas={config.get('use_flow_sigmas')!r}"
            )
        return SamplingRecipe(UNIPC, config)
    if name == FLOW_MATCH_EULER and sigmas is not None:
        sample_type = (config.get("fixed_step_sampler_config") or {}).get("sample_type", "sde")
        if not config.get("stochastic_sampling") or sample_type != "sde":
            raise CheckpointError(
                f"{path}: a distilled schedule must sample stochastically (stochastic_sampling=true, "
                f"sample_type='sde'); got stochastic_sampling={config.get('stochastic_sampling')!r}, "
                f"sample_type={sample_type!r}"
            )
        return SamplingRecipe(FLOW_MATCH_EULER, config, sigmas)
    raise CheckpointError(
        f"{path}: unsupported sampling recipe {name} with{'' if sigmas else 'out'} a fixed sigma list; "
        f"supported: {UNIPC} (base) or {FLOW_MATCH_EULER} with fixed_step_sampler_config.t_list (distilled)"
    )


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


def guidance_at(t: float, guidance: float, interval: tuple[float, float] | None) -> float:
    """The CFG scale at scheduler timestep ``t`` (0..1000): 1.0 outside ``interval``."""
    if interval is None or interval[0] <= t <= interval[1]:
        return guidance
    return 1.0
