"""diffusers' Cosmos3OmniTransformer (the reference implementation): tiny random models and its pipeline.

``reference_forward`` (in ``cosmos3.diffusers_model``, which the FP8 exporter's calibration also
uses) drives the model the way diffusers' pipeline does.
"""

from __future__ import annotations

import torch
from diffusers import Cosmos3OmniTransformer

from cosmos3.diffusers_model import load_diffusers_transformer, reference_forward

__all__ = ["TINY", "SUPER_SHAPED", "tiny_reference", "reference_forward", "diffusers_pipeline"]

TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=64, latent_channel=4, latent_patch_size=2, patch_latent_dim=16,
    rope_scaling={"mrope_interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
    rope_theta=10000.0, sound_gen=False, action_gen=False,
)

# Super's head layout at TINY's head_dim: Nano's query width equals its hidden size (32 x 128 = 4096) in groups of 4;
# Super's is above it (64 x 128 = 8192 > 5120) in groups of 8, intermediate 5x hidden (docs/models.md).
SUPER_SHAPED = dict(hidden_size=48, num_attention_heads=8, num_key_value_heads=1, intermediate_size=240)


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


def diffusers_pipeline(root, pipe, *, sound: bool = False):
    """diffusers' published ``Cosmos3OmniPipeline`` over the checkpoint at ``root`` in fp32, sharing ``pipe``'s
    tokenizer and VAE, with the published docs' video scheduler settings; ``sound``: diffusers loads the
    checkpoint's ``sound_tokenizer/`` itself."""
    from diffusers import Cosmos3AVAEAudioTokenizer, Cosmos3OmniPipeline, UniPCMultistepScheduler

    transformer = load_diffusers_transformer(root / "transformer", torch.float32)
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
