"""The toy's sound tokenizer: diffusers' ``Cosmos3AVAEAudioTokenizer``, small and decoder-only, over a designed code.

A clip's sound latents ``[SOUND_DIM, T_s]`` (25 frames per second, as Nano's) hold, in every latent frame,
the shape colour's code (a fixed +-1 vector, ``CODES``) times the loudness at that frame. The code is
designed rather than learned by an encoder (the pipeline only ever decodes); the decoder is trained to
turn such latents into the tone ``toy.scenes.tone`` describes, and the transformer learns to generate the
latents from captions. Starting the decoder nearly linear (Snake activations at ~zero frequency,
residual branches off) makes that a well-posed fit: a few hundred steps on a CPU reach ~20 dB.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from cosmos3.rules.config import SoundConfig
from toy.scenes import COLOURS, FPS, FRAMES, LOUD, PITCHES, QUIET, TONE_PEAK, Scene, loudness

# 8000 Hz, the lowest rate an AAC track carries, over a 320-sample hop: 25 latent frames per second.
SOUND = SoundConfig(sound_dim=16, latent_fps=25.0, sampling_rate=8000, hop_size=320, channels=1)
SAMPLES = SOUND.samples(FRAMES, FPS)  # a toy clip's waveform: 9 frames at 8 fps = 1.125 s = 9000 samples
LATENT_FRAMES = SOUND.latent_frames(FRAMES, FPS)  # 29 (the decoder's 9280 samples are trimmed to the clip)
SOUND_DIM, SAMPLING_RATE, HOP = SOUND.sound_dim, SOUND.sampling_rate, SOUND.hop_size
TOKENIZER_CONFIG = {
    "sampling_rate": SAMPLING_RATE,
    "vocoder_input_dim": SOUND_DIM,
    "dec_dim": 8,
    "dec_c_mults": [1, 2, 4],
    "dec_strides": [4, 8, 10],  # prod = HOP
    "dec_out_channels": 1,  # mono
    "encoder_enabled": False,
}
NAMES = list(COLOURS)
# One +-1 code per colour; 16 random signs are nearly orthogonal, so colours are far apart in latent space.
CODES = torch.sign(torch.randn(len(NAMES), SOUND_DIM, generator=torch.Generator().manual_seed(1)))

DECODER_LR = 2e-3
DECODER_BATCH = 8


def _frame_progress() -> np.ndarray:
    """Where each latent frame's centre falls in the clip, 0..1 (clipped past the clip's last sample)."""
    return np.clip((np.arange(LATENT_FRAMES) + 0.5) * HOP / SAMPLES, 0.0, 1.0)


def latents(scene: Scene) -> torch.Tensor:
    """The sound latents ``[SOUND_DIM, LATENT_FRAMES]`` of a toy clip of ``scene``."""
    level = torch.from_numpy(loudness(scene, _frame_progress())).float()  # [T_s]
    return CODES[NAMES.index(scene.colour)][:, None] * level[None]


def _decoder_batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random colours and straight loudness ramps: latents ``[B, D, T_s]`` and their tones ``[B, 1, T_s * HOP]``."""
    colour = torch.randint(len(NAMES), (DECODER_BATCH,), generator=generator)
    start, end = (QUIET + (LOUD - QUIET) * torch.rand(DECODER_BATCH, generator=generator) for _ in range(2))
    ramp = lambda progress: start[:, None] + (end - start)[:, None] * progress[None]  # noqa: E731
    level = ramp(torch.from_numpy(_frame_progress()).float())  # [B, T_s]
    n = torch.arange(LATENT_FRAMES * HOP)
    pitch = torch.tensor([PITCHES[NAMES[c]] for c in colour])
    envelope = ramp((n / SAMPLES).clamp(max=1.0))  # [B, N], as toy.scenes.tone's loudness
    wave = TONE_PEAK * envelope * torch.sin(2 * math.pi * pitch[:, None] * (n / SAMPLING_RATE)[None])
    return CODES[colour][:, :, None] * level[:, None], wave[:, None]


def _nearly_linear(tokenizer) -> None:
    """Snake(x) = x + sin^2(a x) / b is x as a -> 0; a residual unit whose last conv is zero is the identity."""
    with torch.no_grad():
        for name, param in tokenizer.named_parameters():
            if name.endswith("alpha"):  # log-scale: a = exp(-6)
                param.fill_(-6.0)
            if "res_unit" in name and name.endswith("conv2.weight_g"):
                param.zero_()


def train_tokenizer(steps: int, seed: int):
    """The decoder fitted to toy clips' tones (relative squared error)."""
    from diffusers import Cosmos3AVAEAudioTokenizer

    torch.manual_seed(seed)
    tokenizer = Cosmos3AVAEAudioTokenizer(**TOKENIZER_CONFIG)
    _nearly_linear(tokenizer)
    optimizer = torch.optim.AdamW(tokenizer.parameters(), lr=DECODER_LR, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for step in range(steps):
        z, wave = _decoder_batch(generator)
        loss = ((tokenizer.decoder(z) - wave) ** 2).mean() / (wave**2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tokenizer.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"sound decoder step {step}: relative error {loss.item():.4f} ({time.perf_counter() - start:.0f}s)",
                  flush=True)
    return tokenizer.eval()
