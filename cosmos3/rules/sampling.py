"""The denoising loop's sampling recipe, read from the checkpoint's ``scheduler/`` (docs/checkpoints.md §4.2),
torch-free; ``cosmos3.scheduler`` builds the scheduler from it.

Two recipes exist, told apart by the scheduler config the checkpoint ships:

* base checkpoints: ``UniPCMultistepScheduler`` on flow sigmas (velocity prediction). The pipeline
  sets ``flow_shift`` per task (10 for video, 3 for images) and turns Karras spacing off, as the
  published docs do on top of the shipped config;
* distilled 4-step checkpoints: ``FlowMatchEulerDiscreteScheduler`` with ``stochastic_sampling`` on
  a fixed sigma list (``fixed_step_sampler_config.t_list``). Guidance is baked into the weights and
  every step re-noises with the request's generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cosmos3.errors import CheckpointError
from cosmos3.rules.checkpoint_files import read_json

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


def guidance_at(t: float, guidance: float, interval: tuple[float, float] | None) -> float:
    """The CFG scale at scheduler timestep ``t`` (0..1000): 1.0 outside ``interval``."""
    if interval is None or interval[0] <= t <= interval[1]:
        return guidance
    return 1.0
