"""The checkpoint's ``vae/``: diffusers ``AutoencoderKLWan`` (Wan 2.2) plus Cosmos3's latent normalisation.

The transformer sees *normalised* latents, ``(mu - latents_mean) / latents_std`` per channel, with
``mu`` the posterior mode (no sampling), as the published pipeline encodes (reference §2.3).
The Wan VAE is causal in time: latent frame ``k`` depends only on pixel frames ``<= 4k`` and decoded
pixel frame 0 only on latent frame 0. The pipeline relies on this to encode only conditioning frames.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos3.errors import CheckpointError


class WanVAE:
    """Pixels ``[3, T, H, W]`` in ``[-1, 1]`` <-> normalised latents ``[C, T', H', W']``."""

    def __init__(self, vae):
        self.vae = vae
        config = vae.config
        self.z_dim = int(config.z_dim)
        self.spatial_factor = int(config.scale_factor_spatial)
        self.temporal_factor = int(config.scale_factor_temporal)
        if len(config.latents_mean) != self.z_dim or len(config.latents_std) != self.z_dim:
            raise CheckpointError(
                f"vae/config.json: latents_mean and latents_std need z_dim={self.z_dim} entries each, "
                f"got {len(config.latents_mean)} and {len(config.latents_std)}"
            )
        param = next(vae.parameters())
        self.mean = torch.tensor(config.latents_mean, dtype=param.dtype, device=param.device).view(-1, 1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(config.latents_std, dtype=param.dtype, device=param.device).view(-1, 1, 1, 1)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: torch.device, dtype: torch.dtype = torch.float32) -> WanVAE:
        from diffusers import AutoencoderKLWan

        path = Path(path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: no config.json (is this the checkpoint's vae/ dir?)")
        # low_cpu_mem_usage=False: the fast path needs `accelerate`, which is not a dependency.
        vae = AutoencoderKLWan.from_pretrained(str(path), torch_dtype=dtype, low_cpu_mem_usage=False)
        return cls(vae.to(device).eval())

    @property
    def dtype(self) -> torch.dtype:
        return self.mean.dtype

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``[C, T', H', W']`` for a clip of ``frames`` pixel frames."""
        return (
            self.z_dim,
            (frames - 1) // self.temporal_factor + 1,
            height // self.spatial_factor,
            width // self.spatial_factor,
        )

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``[3, T, H, W]`` in ``[-1, 1]`` -> normalised float32 latents ``[C, T', H', W']``."""
        x = video.to(device=self.mean.device, dtype=self.dtype).unsqueeze(0)  # [1, 3, T, H, W]
        mu = self.vae.encode(x).latent_dist.mode()[0]  # [C, T', H', W']
        return ((mu - self.mean) * self.inv_std).float()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``[C, T', H', W']`` -> pixels ``[3, T, H, W]`` in ``[-1, 1]``."""
        z = latents.to(self.dtype) / self.inv_std + self.mean
        return self.vae.decode(z.unsqueeze(0)).sample[0]
