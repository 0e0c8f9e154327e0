"""The VAE decode on CUDA: fastvae's, as ``WanVAE.decode`` calls it, against diffusers' on the same latents (a
Wan 2.2 VAE's encoding of a synthetic video; random weights), and ``WanVAE``'s chunks against fastvae's own
whole decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos3.media import to_uint8_frames
from cosmos3.rules.config import VAEConfig
from cosmos3.vae import DECODE_CHUNK_FRAMES, WanVAE
from testbed.wan_vae import WAN22_VAE, synthetic_video
from toy import measure

pytestmark = pytest.mark.gpu
MIN_PSNR = 50.0  # dB against diffusers' frames; measured 51.1 at 720p (benchmarks/results/h100-vae-decode.md)


@torch.no_grad()
def test_fastvae_decodes_the_frames_diffusers_decodes():
    fastvae = pytest.importorskip("fastvae")
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKLWan(**WAN22_VAE).to(torch.bfloat16).eval()
    z = vae.encode(synthetic_video(17, 256, 256, "cuda").to(torch.bfloat16)).latent_dist.mode()  # [1, 48, 5, 16, 16]
    reference = to_uint8_frames(vae.decode(z).sample[0])  # [17, 256, 256, 3]
    ours = to_uint8_frames(fastvae.FastVAEDecoder.from_vae(vae).decode(z, chunk_frames=DECODE_CHUNK_FRAMES)[0])
    assert ours.shape == reference.shape
    assert measure.psnr(ours, reference) >= MIN_PSNR


@torch.no_grad()
def test_the_decodes_chunks_are_fastvaes_whole_decode_cut_in_time():
    pytest.importorskip("fastvae")
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKLWan(**WAN22_VAE).to(torch.bfloat16).eval()
    config = VAEConfig(z_dim=48, spatial_factor=16, temporal_factor=4, latents_mean=tuple(WAN22_VAE["latents_mean"]),
                       latents_std=tuple(WAN22_VAE["latents_std"]))
    latents = torch.randn(48, 5, 16, 16, device="cuda")  # normalised, as the sampler leaves them
    wan = WanVAE(vae, config).to(torch.device("cuda"))  # its decoder is fastvae's
    whole = wan._fast.decode((latents.to(wan.dtype) / wan.inv_std + wan.mean)[None], chunk_frames=DECODE_CHUNK_FRAMES)
    chunks = list(wan.decode_chunks(latents))
    assert [c.shape[1] for c in chunks] == [1, 4, 4, 4, 4]  # the first latent frame alone, then 4 pixel frames each
    np.testing.assert_array_equal(to_uint8_frames(torch.cat(chunks, dim=1)), to_uint8_frames(whole[0]))
