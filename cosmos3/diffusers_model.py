"""diffusers' ``Cosmos3OmniTransformer`` driven the way its own pipeline drives it.

Two users: the FP8 exporter, whose ModelOpt calibration runs our pipeline's real denoising
passes with diffusers' model (the one ModelOpt quantizes and exports) as the velocity
(``DiffusersVelocity``), and the tests, which compare our model against this independent
implementation (position ids come from the reference pipeline's own builders).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import Cosmos3OmniTransformer
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)

from cosmos3.checkpoint.weights import CheckpointFiles
from cosmos3.rules.config import Cosmos3Config
from cosmos3.transformer import GenOutput


def load_diffusers_transformer(directory: str | Path, dtype: torch.dtype = torch.bfloat16) -> Cosmos3OmniTransformer:
    """A transformer/ directory as diffusers' model in ``dtype``, ``time_embedder`` fp32 as published.

    Built from its config and filled strictly, key for key (``from_pretrained`` would need
    ``accelerate`` to keep time_embedder in fp32); legacy key layouts are read through our reader.
    """
    config = {k: v for k, v in Cosmos3OmniTransformer.load_config(str(directory)).items() if not k.startswith("_")}
    model = Cosmos3OmniTransformer.from_config(config)
    files = CheckpointFiles(directory)
    model.load_state_dict({key: files.get(key) for key in files.keys()}, strict=True)
    model.to(dtype)
    model.time_embedder.float()  # diffusers' _keep_in_fp32_modules
    return model.eval().requires_grad_(False)


@torch.no_grad()
def reference_forward(model, input_ids, latents, timestep, *, fps=None, condition_frames=(), sound=None):
    """One evaluation: -> (vision velocity [C, T, H, W], sound velocity [sound_dim, T_s] or None)."""
    cfg = model.config
    dev = latents.device
    p = cfg.latent_patch_size
    und_len = input_ids.numel()
    c, t, h, w = latents.shape
    hp, wp = -(-h // p), -(-w // p)
    text_ids, next_offset = get_3d_mrope_ids_text_tokens(und_len, 0, use_float_positions=cfg.enable_fps_modulation)
    offset = next_offset + cfg.unified_3d_mrope_temporal_modality_margin
    vision_fps = fps if cfg.enable_fps_modulation else None
    vision_ids, _ = get_3d_mrope_ids_vae_tokens(t, hp, wp, offset, True, fps=vision_fps, base_fps=float(cfg.base_fps),
                                                temporal_compression_factor=4)
    noisy = [i for i in range(t) if i not in set(condition_frames)]
    n_vision = t * hp * wp
    mse = [und_len + f * hp * wp + j for f in noisy for j in range(hp * wp)]
    kwargs = {}
    segments = [text_ids.float(), vision_ids.float()]
    seq_len = und_len + n_vision
    if sound is not None:
        t_s = sound.shape[1]
        sound_fps = cfg.sound_latent_fps if cfg.enable_fps_modulation else None
        sound_ids, _ = get_3d_mrope_ids_vae_tokens(t_s, 1, 1, offset, True, fps=sound_fps,
                                                   base_fps=float(cfg.base_fps), temporal_compression_factor=1)
        segments.append(sound_ids.float())
        idx = torch.arange(seq_len, seq_len + t_s, device=dev)
        kwargs = dict(sound_tokens=[sound], sound_token_shapes=[(t_s, 1, 1)], sound_sequence_indexes=idx,
                      sound_mse_loss_indexes=idx, sound_timesteps=torch.full((t_s,), float(timestep), device=dev),
                      sound_noisy_frame_indexes=[torch.arange(t_s, device=dev)])
        seq_len += t_s
    out = model(
        input_ids=input_ids, text_indexes=torch.arange(und_len, device=dev),
        position_ids=torch.cat(segments, dim=1).to(dev), und_len=und_len, sequence_length=seq_len,
        vision_tokens=[latents[None]], vision_token_shapes=[(t, hp, wp)],
        vision_sequence_indexes=torch.arange(und_len, und_len + n_vision, device=dev),
        vision_mse_loss_indexes=torch.tensor(mse, dtype=torch.long, device=dev),
        vision_timesteps=torch.full((len(noisy) * hp * wp,), float(timestep), device=dev),
        vision_noisy_frame_indexes=[torch.tensor(noisy, dtype=torch.long, device=dev)], **kwargs,
    )
    return out.sample[0][0], (out.sound[0] if out.sound is not None else None)


class _DiffusersAttention:
    """diffusers runs its own attention processor; renders record that, not one of our kernels."""

    def describe(self, device) -> dict:
        return {"choice": "diffusers"}


class DiffusersVelocity:
    """diffusers' model behind the interface ``Cosmos3Pipeline`` drives (``encode_text``, ``__call__``, ...).

    diffusers recomputes the UND tower on every call (no cache; the result is the same), so
    ``encode_text`` keeps nothing. Inputs arrive in the pipeline's dtype and run in the model's.
    """

    precision = "diffusers"
    fp8_accumulation = None  # no FP8 GEMMs of ours (ModelOpt's calibration simulates its quantization)
    attention = _DiffusersAttention()
    cuda_graphs = None  # diffusers' forward runs eagerly

    def __init__(self, model: Cosmos3OmniTransformer, config: Cosmos3Config):
        self.model = model
        self.config = config
        self.dtype = next(model.parameters()).dtype

    def encode_text(self, input_ids: torch.Tensor) -> None:
        return None

    def set_denoising_step(self, step: int, num_steps: int) -> None:
        pass

    def prepare_gen(self, latent_shape, sound_frames) -> None:
        pass  # no CUDA graphs: nothing kept per pass length

    def step_policy_info(self) -> None:
        return None

    def __call__(self, input_ids, latents, timestep, *, und_cache=None, fps=None, condition_frames=(),
                 sound_latents=None) -> GenOutput:
        sound = None if sound_latents is None else sound_latents.to(self.dtype)
        vision, sound = reference_forward(self.model, input_ids, latents.to(self.dtype), float(timestep), fps=fps,
                                          condition_frames=condition_frames, sound=sound)
        return GenOutput(vision, sound)
