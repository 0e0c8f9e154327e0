"""Flow-matching training of diffusers' ``Cosmos3OmniTransformer``, a batch of same-length samples at a time.

diffusers' forward packs one sample per call (one text prefix, ``und_len``); training a few thousand
steps on a CPU needs batches. ``BatchedMoTAttnProcessor`` computes exactly what diffusers'
``Cosmos3AttnProcessor`` computes, with a leading batch axis; ``predict`` drives the model's own
modules (embeddings, decoder layers, heads) in the order diffusers' ``forward`` does, with position
ids from the diffusers pipeline's builders. ``tests/toy/test_flow.py`` checks both against diffusers'
forward and against our inference model.

Objective (docs/checkpoints.md §4.2): ``x_s = (1 - s) x0 + s noise`` and the model predicts the velocity
``noise - x0`` at timestep ``1000 s``; UniPC's ``flow_prediction`` reads it back as
``x0 = x_s - s v``, which is what the pipeline's sampler does. A clip's sound latents, when given,
follow the vision tokens in the GEN stream at the same noise level, as the pipeline denoises them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)

VAE_TEMPORAL_COMPRESSION = 4  # the Wan VAE's pixel frames per latent frame, as fps modulation counts them


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _heads(attn, projections, norms, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``x [B, L, H]`` -> q ``[B, nh, L, hd]``, k/v ``[B, nkv, L, hd]``: per-head QK RMSNorm, then RoPE."""
    b, length, _ = x.shape
    q, k, v = (proj(x).view(b, length, -1, attn.head_dim) for proj in projections)
    q, k = norms[0](q), norms[1](k)
    cos, sin = cos[:, None], sin[:, None]  # [L, 1, hd]
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


class BatchedMoTAttnProcessor:
    """diffusers' ``Cosmos3AttnProcessor`` over ``und [B, S, H]`` and ``gen [B, N, H]``.

    UND is causal over its own text; GEN attends, unmasked, to ``[K_und ; K_gen]``.
    """

    def __call__(self, attn, und_seq: torch.Tensor, gen_seq: torch.Tensor, rotary_emb):
        if attn.k_norm_und_for_gen is not None:
            raise NotImplementedError("use_und_k_norm_for_gen=True is not supported by the toy trainer")
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        q_und, k_und, v_und = _heads(attn, (attn.to_q, attn.to_k, attn.to_v), (attn.norm_q, attn.norm_k),
                                     und_seq, cos_und, sin_und)
        q_gen, k_gen, v_gen = _heads(attn, (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj),
                                     (attn.norm_added_q, attn.norm_added_k), gen_seq, cos_gen, sin_gen)
        causal = F.scaled_dot_product_attention(q_und, k_und, v_und, is_causal=True, enable_gqa=True)
        full = F.scaled_dot_product_attention(
            q_gen, torch.cat([k_und, k_gen], dim=2), torch.cat([v_und, v_gen], dim=2), enable_gqa=True
        )  # [B, nh, N, hd]
        return attn.to_out(causal.transpose(1, 2).flatten(2)), attn.to_add_out(full.transpose(1, 2).flatten(2))


def patchify(latents: torch.Tensor, p: int) -> torch.Tensor:
    """``[B, C, T, H, W]`` -> ``[B, T*Hp*Wp, p*p*C]`` in diffusers' ``thwpqc`` token order."""
    b, c, t, h, w = latents.shape
    x = latents.reshape(b, c, t, h // p, p, w // p, p)
    return torch.einsum("bcthpwq->bthwpqc", x).reshape(b, t * (h // p) * (w // p), p * p * c)


def unpatchify(tokens: torch.Tensor, p: int, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """Inverse of ``patchify``: ``[B, T*Hp*Wp, p*p*C]`` -> ``[B, C, T, H, W]`` for ``shape = (C, T, H, W)``."""
    c, t, h, w = shape
    x = tokens.reshape(tokens.shape[0], t, h // p, w // p, p, p, c)
    return torch.einsum("bthwpqc->bcthpwq", x).reshape(tokens.shape[0], c, t, h, w)


def rotary(model, text_length: int, grid: tuple[int, int, int], fps: float | None, sound_frames: int | None = None):
    """cos/sin ``[S + N (+ T_s), hd]`` for a text prefix, a ``(T, Hp, Wp)`` vision grid and ``sound_frames`` sound
    tokens, as diffusers' pipeline places them (sound shares the vision temporal offset, at sound_latent_fps)."""
    cfg = model.config
    text_ids, offset = get_3d_mrope_ids_text_tokens(text_length, 0, use_float_positions=cfg.enable_fps_modulation)
    offset += cfg.unified_3d_mrope_temporal_modality_margin
    vision_ids, _ = get_3d_mrope_ids_vae_tokens(
        *grid, offset, cfg.unified_3d_mrope_reset_spatial_ids,
        fps=fps if cfg.enable_fps_modulation else None, base_fps=float(cfg.base_fps),
        temporal_compression_factor=VAE_TEMPORAL_COMPRESSION,
    )
    segments = [text_ids.float(), vision_ids.float()]
    if sound_frames is not None:
        sound_ids, _ = get_3d_mrope_ids_vae_tokens(
            sound_frames, 1, 1, offset, cfg.unified_3d_mrope_reset_spatial_ids,
            fps=float(cfg.sound_latent_fps) if cfg.enable_fps_modulation else None, base_fps=float(cfg.base_fps),
            temporal_compression_factor=1,
        )
        segments.append(sound_ids.float())
    positions = torch.cat(segments, dim=1)  # [3, S + N (+ T_s)]
    device = model.proj_in.weight.device
    cos, sin = model.rotary_emb(positions.unsqueeze(1).to(device), device=device, dtype=model.proj_in.weight.dtype)
    return cos.squeeze(0), sin.squeeze(0)


def predict(model, input_ids: torch.Tensor, latents: torch.Tensor, sigma: torch.Tensor, fps: float | None,
            sound: torch.Tensor | None = None):
    """Velocities for ``input_ids [B, S]``, noisy ``latents [B, C, T, H, W]`` (and ``sound [B, D, T_s]``),
    ``sigma [B]``.

    Returns vision tokens ``[B, N, p*p*C]`` and the sound velocity ``[B, D, T_s]`` (None without sound).
    Every frame is noisy (T2I / T2V); ``fps`` is None for images. The model must carry a
    ``BatchedMoTAttnProcessor`` (``model.set_attn_processor``).
    """
    cfg = model.config
    p = cfg.latent_patch_size
    _, _, t, h, w = latents.shape
    text_length = input_ids.shape[1]
    cos, sin = rotary(model, text_length, (t, h // p, w // p), fps, None if sound is None else sound.shape[2])
    und = model.embed_tokens(input_ids)  # [B, S, H]
    # The timestep embedding goes on every (noisy) vision and sound token.
    t_proj = model.time_proj(sigma * 1000.0 * cfg.timestep_scale)
    t_emb = model.time_embedder(t_proj)[:, None].to(und.dtype)  # [B, 1, H]
    gen = model.proj_in(patchify(latents, p)) + t_emb  # [B, N, H]
    n_vision = gen.shape[1]
    if sound is not None:
        sound_tokens = model.audio_proj_in(sound.transpose(1, 2)) + model.audio_modality_embed + t_emb  # [B, T_s, H]
        gen = torch.cat([gen, sound_tokens], dim=1)
    rotary_emb = (cos[:text_length], sin[:text_length], cos[text_length:], sin[text_length:])
    for layer in model.layers:
        und, gen = layer(und, gen, rotary_emb)
    gen = model.norm_moe_gen(gen)
    sound_velocity = None if sound is None else model.audio_proj_out(gen[:, n_vision:]).transpose(1, 2)
    return model.proj_out(gen[:, :n_vision]), sound_velocity


def shift_sigmas(u: torch.Tensor, shift: float) -> torch.Tensor:
    """The sampler's flow shift applied to ``u`` in [0, 1]: ``shift u / (1 + (shift - 1) u)``."""
    return shift * u / (1 + (shift - 1) * u)


def loss(model, input_ids: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor,
         fps: float | None, sound: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Mean squared error of the predicted velocity against ``noise - x0`` at ``x_s = (1 - s) x0 + s noise``.

    ``sound``: a clip's ``(x0, noise)`` sound latents ``[B, D, T_s]``, noised alike; its error is added.
    """
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * x0 + s * noise
    target = patchify(noise - x0, model.config.latent_patch_size)
    noisy_sound = None if sound is None else (1 - s[..., 0, 0]) * sound[0] + s[..., 0, 0] * sound[1]
    vision, sound_velocity = predict(model, input_ids, noisy, sigma, fps, noisy_sound)
    error = F.mse_loss(vision, target)
    return error if sound is None else error + F.mse_loss(sound_velocity, sound[1] - sound[0])
