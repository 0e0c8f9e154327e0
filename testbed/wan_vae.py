"""The Wan 2.2 VAE's configuration as published, and a synthetic video that looks like footage to encode with it:
what the VAE's benchmark and its GPU test build on."""

from __future__ import annotations

import torch

# Wan 2.2 VAE (Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json): 2x2 patchify, residual, z_dim 48.
WAN22_VAE = {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0, "is_residual": True,
    "in_channels": 12, "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4,
    "latents_mean": [
        -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
        0.157, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
        -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.123, -0.0313, -0.1649, 0.0117, 0.0723,
        -0.2839, -0.2083, -0.052, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
    ],
    "latents_std": [
        0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.499, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
        0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
        0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
        0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.06, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
    ],
}


def synthetic_video(frames: int, height: int, width: int, device) -> torch.Tensor:
    """``[1, 3, T, H, W]`` in [-1, 1]: gradients, a fixed texture and three discs crossing the frame."""
    t = torch.arange(frames, device=device, dtype=torch.float32).view(-1, 1, 1)
    y = torch.linspace(-1, 1, height, device=device).view(1, -1, 1)
    x = torch.linspace(-1, 1, width, device=device).view(1, 1, -1)
    g = torch.Generator(device=device).manual_seed(0)
    texture = torch.rand((1, height, width), generator=g, device=device) * 0.2 - 0.1
    channels = []
    for c, (cx, cy, speed) in enumerate(((-0.8, -0.3, 0.01), (0.6, 0.4, -0.008), (0.0, 0.0, 0.005))):
        base = 0.5 * torch.sin(3 * x + 2 * y * (c + 1) + 0.05 * t) + texture
        disc = ((x - (cx + speed * t)) ** 2 + (y - cy) ** 2) < 0.05
        channels.append(torch.where(disc, torch.full_like(base, 0.9 - 0.6 * c), base))
    return torch.stack(channels).clamp(-1, 1).unsqueeze(0)  # [1, 3, T, H, W]
