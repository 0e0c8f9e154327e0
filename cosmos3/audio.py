"""The checkpoint's ``sound_tokenizer/``: diffusers ``Cosmos3AVAEAudioTokenizer``, used here to decode only.

Sound latents ``[sound_dim, T_s]`` (one frame per ``hop_size`` waveform samples, 25 per second in
Nano: 48 kHz over a 1920 hop) decode to a float waveform ``[channels, T_s * hop_size]``, as the
published pipeline's ``decode_sound`` does. The latents are not normalised (the shipped AVAE has no
latent mean/std). What the pipeline needs to size latents is read torch-free by
``cosmos3.rules.config.read_sound_support``; this module holds the weights.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from cosmos3.background_build import BackgroundBuild
from cosmos3.errors import CheckpointError, SoundTokenizerLoadError
from cosmos3.library_import import LIBRARY_IMPORT
from cosmos3.rules.config import SoundConfig

# diffusers' sound tokenizer builds its convolutions with torch.nn.utils.weight_norm, which torch deprecates with a
# FutureWarning at the first build of every process: a note about diffusers' code, printed in every demo and worker
# log, that no user can act on. Warning filters are process-wide, so this one is installed once, here, for that one
# message (a filter around the build would race the other threads' warnings).
warnings.filterwarnings("ignore", message=r"`torch\.nn\.utils\.weight_norm` is deprecated", category=FutureWarning)


class SoundTokenizer:
    """Sound latents ``[sound_dim, T_s]`` -> waveform ``[channels, T_s * hop_size]`` at ``config.sampling_rate``."""

    def __init__(self, tokenizer, config: SoundConfig):
        if tokenizer._hop_size != config.hop_size:  # one rule for both: diffusers' own hop is what decode uses
            raise CheckpointError(f"sound tokenizer hop {tokenizer._hop_size} != its config's {config.hop_size}")
        self.tokenizer = tokenizer
        self.config = config

    @classmethod
    def from_pretrained(cls, path: str | Path, config: SoundConfig, *, device: torch.device) -> SoundTokenizer:
        """Loads in fp32 (like the VAE); a folder diffusers cannot load is a ``CheckpointError`` naming it."""
        with LIBRARY_IMPORT:  # not beside a background VAE build's import
            from diffusers import Cosmos3AVAEAudioTokenizer
        from safetensors import SafetensorError

        path = Path(path)
        try:
            # low_cpu_mem_usage=False: the fast path needs `accelerate`, which is not a dependency.
            tokenizer = Cosmos3AVAEAudioTokenizer.from_pretrained(
                str(path), torch_dtype=torch.float32, low_cpu_mem_usage=False
            )
        except (OSError, ValueError, RuntimeError, NotImplementedError, SafetensorError) as err:
            raise CheckpointError(
                f"{path}: cannot load the sound tokenizer ({type(err).__name__}: {err}); "
                "re-export the checkpoint's sound_tokenizer/ folder (meanwhile a farm still renders the jobs with "
                "sound: false, and with the folder moved out the checkpoint renders silent clips anywhere)"
            ) from None
        return cls(tokenizer.to(device).eval(), config)

    @classmethod
    def build_in_background(cls, path: Path, config: SoundConfig, *,
                            device: torch.device) -> BackgroundBuild[SoundTokenizer]:
        """``from_pretrained`` on the CPU in a thread, moved to ``device`` where a job first decodes sound: like
        the VAE, it waits for diffusers' import, which a worker need not wait for. ``check_sound_dir`` runs first,
        in the caller."""
        return BackgroundBuild(
            lambda: cls.from_pretrained(path, config, device=torch.device("cpu")),
            device=device, name="build-sound-tokenizer",
            failure=lambda err: SoundTokenizerLoadError(f"{path}: the sound tokenizer did not build: "
                                                        f"{type(err).__name__}: {err}"),
        )

    def to(self, device: torch.device) -> SoundTokenizer:
        self.tokenizer.to(device)
        return self

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[sound_dim, T_s]`` -> float32 waveform ``[channels, T_s * hop_size]``."""
        decoder = next(self.tokenizer.parameters())
        waveform = self.tokenizer.decode(latents.unsqueeze(0).to(decoder.device, decoder.dtype))  # [1, ch, N]
        return waveform[0].float()
