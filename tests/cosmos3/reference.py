"""Drive diffusers' Cosmos3OmniTransformer (the reference implementation) the way its pipeline does.

Position ids come from the reference pipeline's own builders, so our model's position logic is
compared against an independent implementation, not against itself.
"""

from __future__ import annotations

import torch
from diffusers import Cosmos3OmniTransformer
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)

TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=64, latent_channel=4, latent_patch_size=2, patch_latent_dim=16,
    rope_scaling={"mrope_interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
    rope_theta=10000.0, sound_gen=False, action_gen=False,
)


def tiny_reference(seed: int = 0, **overrides) -> Cosmos3OmniTransformer:
    """A small diffusers model with every parameter randomised (norm weights and embeds included)."""
    torch.manual_seed(seed)
    model = Cosmos3OmniTransformer(**{**TINY, **overrides}).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(0.1 * torch.randn_like(param))
    return model


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


def diffusers_pipeline(root, pipe, *, sound: bool = False):
    """diffusers' published ``Cosmos3OmniPipeline`` over the checkpoint at ``root`` in fp32, sharing ``pipe``'s
    tokenizer and VAE, with the published docs' video scheduler settings; ``sound``: diffusers loads the
    checkpoint's ``sound_tokenizer/`` itself."""
    from diffusers import Cosmos3AVAEAudioTokenizer, Cosmos3OmniPipeline, UniPCMultistepScheduler
    from safetensors.torch import load_file

    config = {k: v for k, v in Cosmos3OmniTransformer.load_config(root / "transformer").items()
              if not k.startswith("_")}
    transformer = Cosmos3OmniTransformer.from_config(config)
    state = {}
    for shard in sorted((root / "transformer").glob("*.safetensors")):
        state.update(load_file(shard))
    transformer.load_state_dict({k: v.float() for k, v in state.items()})
    # The published docs' override of the shipped scheduler config for video.
    scheduler = UniPCMultistepScheduler.from_config(
        UniPCMultistepScheduler.load_config(root / "scheduler"), flow_shift=10.0, use_karras_sigmas=False
    )
    return Cosmos3OmniPipeline(
        transformer=transformer.eval(),
        text_tokenizer=pipe.tokenizer.tokenizer,
        vae=pipe.vae.vae,
        scheduler=scheduler,
        sound_tokenizer=Cosmos3AVAEAudioTokenizer.from_pretrained(root / "sound_tokenizer", low_cpu_mem_usage=False)
        if sound else None,
        enable_safety_checker=False,
    )
