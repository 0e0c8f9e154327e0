"""The checkpoint's ``vae/``: diffusers ``AutoencoderKLWan`` (Wan 2.2) plus Cosmos3's latent normalisation.

The transformer sees *normalised* latents, ``(mu - latents_mean) / latents_std`` per channel, with
``mu`` the posterior mode (no sampling), as the published pipeline encodes (reference §2.3).
The Wan VAE is causal in time: latent frame ``k`` depends only on pixel frames ``<= 4k`` and decoded
pixel frame 0 only on latent frame 0. The pipeline relies on this to encode only conditioning frames.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import torch

from cosmos3.errors import CheckpointError

# An untiled Wan 2.2 decode of 189 frames at 1280x720 peaked 22.4 GiB above the resident model in fp32 and 11.1 GiB
# in bf16 on the H200 (benchmarks/results/h200-2026-12-01-render.md): ~138 and ~68 bytes per output pixel; per
# byte of the VAE's dtype, rounded up.
UNTILED_DECODE_BYTES_PER_PIXEL_PER_ELEMENT_BYTE = 38


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
        self.force_tiling: bool | None = None  # None: decide by free memory; True / False: always / never tile
        self.last_decode_tiled: bool | None = None

    @staticmethod
    def prefetch_import() -> threading.Thread:
        """Start importing diffusers' VAE module in a thread, and return it. The import is most of the VAE's
        load (5-8 s of Python module set-up on the CPU machine) and needs only the interpreter, so it can run
        while the transformer's checkpoint read waits on the disk and the copies. Failures are left to
        ``from_pretrained``'s own import, which reports them."""

        def run() -> None:
            with contextlib.suppress(Exception):
                from diffusers import AutoencoderKLWan  # noqa: F401

        thread = threading.Thread(target=run, name="import-diffusers-vae", daemon=True)
        thread.start()
        return thread

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: torch.device, dtype: torch.dtype = torch.float32) -> WanVAE:
        from diffusers import AutoencoderKLWan
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: no config.json (is this the checkpoint's vae/ dir?)")
        weights = path / "diffusion_pytorch_model.safetensors"
        if not weights.is_file():
            raise CheckpointError(f"{path}: no diffusion_pytorch_model.safetensors (the VAE's weights)")
        # Built on the meta device, then given the file's tensors read straight onto `device`. diffusers'
        # from_pretrained without `accelerate` (not a dependency) first initialises every parameter on the CPU
        # and then copies: 15.5 s of a Nano worker's start on the H200 (benchmarks/results/h200-2026-12-01-render.md).
        with torch.device("meta"):
            vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(str(path)))
        state = {k: v.to(dtype) for k, v in load_file(weights, device=str(device)).items()}
        try:
            vae.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as err:  # a missing, unknown or misshapen tensor
            raise CheckpointError(f"{weights}: does not match vae/config.json: {err}") from None
        return cls(vae.eval())

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
        _, t, h, w = latents.shape
        pixels = ((t - 1) * self.temporal_factor + 1) * h * w * self.spatial_factor**2
        tiled = self._tile(pixels * UNTILED_DECODE_BYTES_PER_PIXEL_PER_ELEMENT_BYTE * self.dtype.itemsize)
        if tiled:
            self.vae.enable_tiling()  # diffusers' spatial tiles: less memory, overlapping tiles cost time
        else:
            self.vae.disable_tiling()
        self.last_decode_tiled = tiled
        return self.vae.decode(z.unsqueeze(0)).sample[0]

    def _tile(self, untiled_bytes: int) -> bool:
        """Tile only when an untiled decode would not fit in what the device has free (its own cache included)."""
        if self.force_tiling is not None:
            return self.force_tiling
        device = self.mean.device
        if device.type != "cuda":
            return False  # host memory: the untiled path is the reference
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return untiled_bytes > free + cached
