"""The checkpoint's ``vae/``: diffusers ``AutoencoderKLWan`` (Wan 2.2) plus Cosmos3's latent normalisation.

The transformer sees *normalised* latents, ``(mu - latents_mean) / latents_std`` per channel, with
``mu`` the posterior mode (no sampling), as the published pipeline encodes (docs/checkpoints.md §1).
The Wan VAE is causal in time: latent frame ``k`` depends only on pixel frames ``<= 4k`` and decoded
pixel frame 0 only on latent frame 0. The pipeline relies on this to encode only conditioning frames.

On CUDA the decode runs fastvae's fused, temporally chunked Wan decoder where the ``fast-vae`` extra is installed
(https://github.com/Occipital-Labs/fastvae, MIT; Triton norm+SiLU kernels, channels-last convolutions, the causal
cache carried from chunk to chunk, so chunking changes no output): a 720p/189-frame clip in 5.42 s against diffusers'
9.96 s on the H100, PSNR 51.1 dB against diffusers' frames (benchmarks/results/h100-vae-decode.md); ``decode_chunks``
hands each chunk on as it is done (a worker encodes the clip's MP4 beside its decode). Elsewhere, and for the encode,
diffusers' model runs.

``VAEBuild`` builds one in a thread (``cosmos3.background_build``), so a pipeline can be ready before diffusers'
import (5-6 s on the CPU machine, 12-17 s on the H200 host: benchmarks/results/h200-render.md) and the weights
are; what can be checked without diffusers is checked first, in the caller (``check_vae_dir``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from cosmos3.background_build import BackgroundBuild
from cosmos3.errors import CheckpointError, VAELoadError
from cosmos3.library_import import LIBRARY_IMPORT
from cosmos3.rules.checkpoint_header import DIFFUSERS_WEIGHTS, check_vae_dir
from cosmos3.rules.config import VAEConfig
from cosmos3.rules.memory_plan import UNTILED_DECODE_BYTES_PER_PIXEL_PER_ELEMENT_BYTE

# Latent frames per chunk of fastvae's decode. On the H100 its peak above the weights was 15.1 GiB at 2 and 25.6 at
# 4 (diffusers' untiled decode: 11.1), at the same 5.4 s: the decode is bandwidth-bound past a frame or two, and one
# frame a chunk keeps the peak under diffusers' (~9.9 GiB by the two measured points; h100-vae-decode.md).
DECODE_CHUNK_FRAMES = 1


def _fast_decoder(vae):
    """fastvae's decoder for ``vae`` (on its device), or None where the ``fast-vae`` extra is not installed."""
    try:
        from fastvae import FastVAEDecoder
    except ImportError:
        return None
    return FastVAEDecoder.from_vae(vae)


class WanVAE:
    """Pixels ``[3, T, H, W]`` in ``[-1, 1]`` <-> normalised latents ``[C, T', H', W']``."""

    def __init__(self, vae, config: VAEConfig):
        self.vae = vae
        self.config = config
        param = next(vae.parameters())
        self.mean = torch.tensor(config.latents_mean, dtype=param.dtype, device=param.device).view(-1, 1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(config.latents_std, dtype=param.dtype, device=param.device).view(-1, 1, 1, 1)
        self.force_tiling: bool | None = None  # None: decide by free memory; True / False: always / never tile
        self.last_decode_tiled: bool | None = None
        self._fast = None  # fastvae's decoder, on CUDA (``to``); diffusers' decoder weights are then dropped

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: torch.device, dtype: torch.dtype = torch.float32,
                        latent_channel: int | None = None) -> WanVAE:
        """A ``vae/``, built here; ``latent_channel``: its transformer's, which z_dim must equal (None: unchecked)."""
        path = Path(path)
        return cls.build(path, check_vae_dir(path, latent_channel), device=device, dtype=dtype)

    @classmethod
    def build(cls, path: Path, config: VAEConfig, *, device: torch.device, dtype: torch.dtype) -> WanVAE:
        """The VAE of a ``vae/`` that ``check_vae_dir`` passed (its result is ``config``). Weights that do not match
        the config (a missing, unknown or misshapen tensor, which only diffusers' model knows) are a CheckpointError."""
        with LIBRARY_IMPORT:
            from diffusers import AutoencoderKLWan
        from safetensors.torch import load_file

        # Built on the meta device, then given the file's tensors read straight onto `device`. diffusers'
        # from_pretrained without `accelerate` (not a dependency) first initialises every parameter on the CPU
        # and then copies: 15.5 s of a Nano worker's start on the H200 (benchmarks/results/h200-render.md).
        with torch.device("meta"):
            vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(str(path)))
        weights = path / DIFFUSERS_WEIGHTS
        state = {k: v.to(dtype) for k, v in load_file(weights, device=str(device)).items()}
        try:
            vae.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as err:  # a missing, unknown or misshapen tensor
            raise CheckpointError(f"{weights}: does not match vae/config.json: {err}") from None
        return cls(vae.eval(), config)

    @property
    def decoder(self) -> str:
        """Whose decoder runs: ``fastvae`` (CUDA, the ``fast-vae`` extra) or ``diffusers``."""
        return "diffusers" if self._fast is None else "fastvae"

    @property
    def dtype(self) -> torch.dtype:
        return self.mean.dtype

    def to(self, device: torch.device) -> WanVAE:
        """Moves the model and its latent statistics to ``device`` (in place). On CUDA the decode becomes fastvae's
        where it is installed: its decoder takes channels-last copies of the weights, and diffusers' decoder, which
        nothing calls then, gives its own back."""
        self.vae.to(device)
        self.mean, self.inv_std = self.mean.to(device), self.inv_std.to(device)
        if torch.device(device).type == "cuda" and self._fast is None:
            self._fast = _fast_decoder(self.vae)
            if self._fast is not None:
                self.vae.decoder = None
        return self

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``[3, T, H, W]`` in ``[-1, 1]`` -> normalised float32 latents ``[C, T', H', W']``."""
        x = video.to(device=self.mean.device, dtype=self.dtype).unsqueeze(0)  # [1, 3, T, H, W]
        mu = self.vae.encode(x).latent_dist.mode()[0]  # [C, T', H', W']
        return ((mu - self.mean) * self.inv_std).float()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``[C, T', H', W']`` -> pixels ``[3, T, H, W]`` in ``[-1, 1]``."""
        chunks = list(self.decode_chunks(latents))
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=1)

    @torch.no_grad()
    def decode_chunks(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        """Normalised latents ``[C, T', H', W']`` -> pixels in ``[-1, 1]``, in temporal order, as chunks
        ``[3, T_chunk, H, W]`` the decoder finishes one by one (so a caller can use each while the next decodes).
        fastvae's: the first latent frame alone (one pixel frame), then DECODE_CHUNK_FRAMES latent frames a chunk
        (temporal_factor pixel frames each), never spatial tiles; diffusers': the whole clip, one chunk."""
        z = (latents.to(self.dtype) / self.inv_std + self.mean).unsqueeze(0)  # [1, C, T', H', W']
        if self._fast is None:
            yield self._diffusers_decode(z)
            return
        self.last_decode_tiled = False
        # fastvae's own chunk loop (FastVAEDecoder.decode) assembles the whole clip on the device; this one is
        # that loop through the same decoder core, its causal cache carried across chunks, each chunk handed on.
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        core = self._fast.core
        x = core.apply_post_quant(z)  # [1, C, T', H', W'], channels-last
        cache = core.new_cache()
        start, total = 0, z.shape[2]
        while start < total:
            end = 1 if start == 0 else min(start + DECODE_CHUNK_FRAMES, total)
            pixels = core.decode_chunk(x[:, :, start:end], cache, first_chunk=start == 0)
            if core.patch_size is not None:
                pixels = unpatchify(pixels, core.patch_size)
            yield pixels.clamp_(-1.0, 1.0)[0]  # [3, T_chunk, H, W]
            start = end

    def _diffusers_decode(self, z: torch.Tensor) -> torch.Tensor:
        """``[1, C, T', H', W']`` un-normalised latents -> ``[3, T, H, W]``, spatially tiled only where needed."""
        _, _, t, h, w = z.shape
        pixels = ((t - 1) * self.config.temporal_factor + 1) * h * w * self.config.spatial_factor**2
        tiled = self._tile(pixels * UNTILED_DECODE_BYTES_PER_PIXEL_PER_ELEMENT_BYTE * self.dtype.itemsize)
        if tiled:
            self.vae.enable_tiling()  # diffusers' spatial tiles: less memory, overlapping tiles cost time
        else:
            self.vae.disable_tiling()
        self.last_decode_tiled = tiled
        return self.vae.decode(z).sample[0]

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


class VAEBuild(BackgroundBuild[WanVAE]):
    """A ``WanVAE`` built in the background (``cosmos3.background_build``). ``config`` (``vae/config.json``) is known
    at once; ``check_vae_dir`` runs in the caller, so what it finds raises here. A failed build is a VAELoadError."""

    def __init__(self, path: Path, *, latent_channel: int, device: torch.device, dtype: torch.dtype):
        self.path = path
        self.config = check_vae_dir(path, latent_channel)
        super().__init__(
            lambda: WanVAE.build(path, self.config, device=torch.device("cpu"), dtype=dtype),
            device=device, name="build-vae",
            failure=lambda err: VAELoadError(f"{path}: the VAE did not build: {type(err).__name__}: {err}"),
        )
