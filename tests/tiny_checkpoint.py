"""A tiny random Cosmos3 checkpoint in the published directory layout, built in about two seconds.

    root = make_tiny_checkpoint(tmp_path / "ckpt")                      # base build (UniPC)
    root = make_tiny_checkpoint(tmp_path / "d", scheduler=DISTILLED_SCHEDULER)  # distilled 4-step
    root = make_tiny_checkpoint(tmp_path / "c", num_hidden_layers=3)     # transformer config override
    root = make_tiny_checkpoint(tmp_path / "s", sound=True)              # sound_gen + a sound_tokenizer/

Layout (docs/checkpoints.md §1, §5.2): ``model_index.json``, ``transformer/`` (diffusers
``Cosmos3OmniTransformer.save_pretrained``: bf16 safetensors shards, ``time_embedder`` in fp32, the
index, and a config.json that also carries the published-only keys), ``vae/`` (``AutoencoderKLWan``
in the Wan 2.2 shape: patchified, residual, spatial factor 16, temporal factor 4,
``latents_mean/std``), ``text_tokenizer/`` (word-level ``tokenizer.json`` + ``tokenizer_config.json``
with a ChatML template) and ``scheduler/`` (UniPC on flow sigmas, or the distilled FlowMatch-Euler
recipe), and with ``sound=True`` ``sound_tokenizer/`` (a tiny diffusers ``Cosmos3AVAEAudioTokenizer``,
decoder only, 8 kHz, hop 320 = 25 latent frames per second as the published 48 kHz / 1920).

``mismatch_weights(root, how)`` breaks a checkpoint's VAE (or sound tokenizer) in a way only diffusers' model
sees: one tensor renamed or misshapen, the file and its header still whole.

Overrides: ``scheduler=`` replaces the scheduler config when it names a ``_class_name``, else is
merged into it; ``vae=`` is merged into the VAE constructor arguments; every other key goes to the
transformer: constructor arguments when ``Cosmos3OmniTransformer`` takes them, else straight into
``transformer/config.json`` (e.g. ``quantization_config``).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from toy.layout import (
    DISTILLED_SCHEDULER,  # noqa: F401  (re-exported: the tests take it from here)
    PROMPT_WORDS,
    UNIPC_SCHEDULER,
    save_transformer,
    write_pipeline_files,
    write_tokenizer,
)

Z_DIM = 8  # latent channels: VAE z_dim == transformer latent_channel (48 in the published VAE)
VOCAB_SIZE = 128  # >= the tiny tokenizer's size, like the published 151936 >= Qwen's tokens

TINY_TRANSFORMER = {
    "hidden_size": 32,
    "head_dim": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "latent_channel": Z_DIM,
    "latent_patch_size": 2,
    "patch_latent_dim": Z_DIM * 2 * 2,
    "vocab_size": VOCAB_SIZE,
    # head_dim 8 -> 4 rotary frequencies, split T/H/W like the published [24, 20, 20] of 64.
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default"},
    "sound_gen": False,
    "action_gen": False,
}

TINY_VAE = {
    "base_dim": 8,
    "decoder_base_dim": 8,
    "z_dim": Z_DIM,
    "dim_mult": [1, 1, 1, 1],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    # Wan 2.2: 2x2 patchify (12 = 3 * 2 * 2 channels) + 3 downsamples = spatial factor 16.
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
}

# Sound: the transformer's head and a decoder with the published 25 latent frames/s (8000 Hz / 320).
SOUND_DIM = 8
TINY_SOUND_TOKENIZER = {
    "sampling_rate": 8000,  # the lowest rate AAC encodes at, so tiny renders mux like real ones
    "vocoder_input_dim": SOUND_DIM,
    "dec_dim": 8,
    "dec_c_mults": [1, 2, 2],
    "dec_strides": [4, 8, 10],
    "dec_out_channels": 2,
    "encoder_enabled": False,  # the pipeline only decodes
}

# The prompt words, then a few words the tests' prompts use.
WORDS = PROMPT_WORDS + (
    "red blue green cat dog robot car city street night day walks runs drives through in on at with"
).split()


def _write_transformer(path: Path, seed: int, overrides: dict) -> None:
    from diffusers import Cosmos3OmniTransformer

    accepted = inspect.signature(Cosmos3OmniTransformer.__init__).parameters
    config = {**TINY_TRANSFORMER, **{k: v for k, v in overrides.items() if k in accepted}}
    torch.manual_seed(seed)
    model = Cosmos3OmniTransformer(**config)
    # Small shards so the index file exists, as in every published (multi-GB) checkpoint.
    extra = {k: v for k, v in overrides.items() if k not in accepted}
    save_transformer(model, path, extra_config=extra, max_shard_size="64KB")


def _write_vae(path: Path, seed: int, overrides: dict) -> None:
    from diffusers import AutoencoderKLWan

    config = {**TINY_VAE, **overrides}
    z_dim = config["z_dim"]
    stats = torch.Generator().manual_seed(seed + 1)
    config.setdefault("latents_mean", [round(v, 4) for v in (0.3 * torch.randn(z_dim, generator=stats)).tolist()])
    config.setdefault("latents_std", [round(v, 4) for v in (0.5 + torch.rand(z_dim, generator=stats)).tolist()])
    torch.manual_seed(seed)
    AutoencoderKLWan(**config).save_pretrained(str(path), safe_serialization=True)


def _write_sound_tokenizer(path: Path, seed: int) -> None:
    from diffusers import Cosmos3AVAEAudioTokenizer

    torch.manual_seed(seed)
    tokenizer = Cosmos3AVAEAudioTokenizer(**TINY_SOUND_TOKENIZER)
    tokenizer.save_pretrained(str(path), safe_serialization=True)


def _scheduler_config(override: dict | None) -> dict:
    if not override:
        return dict(UNIPC_SCHEDULER)
    if "_class_name" in override:
        return dict(override)
    return {**UNIPC_SCHEDULER, **override}


def make_tiny_checkpoint(root: Path, *, seed: int = 0, sound: bool = False, **overrides) -> Path:
    """Write a tiny random checkpoint under ``root`` (created) and return ``root``."""
    root = Path(root)
    scheduler = _scheduler_config(overrides.pop("scheduler", None))
    vae_overrides = overrides.pop("vae", {})
    if sound:
        overrides = {"sound_gen": True, "sound_dim": SOUND_DIM, **overrides}
    _write_transformer(root / "transformer", seed, overrides)
    _write_vae(root / "vae", seed, vae_overrides)
    write_tokenizer(root / "text_tokenizer", WORDS, vocab_size=VOCAB_SIZE)
    write_pipeline_files(root, scheduler, sound=sound)
    if sound:
        _write_sound_tokenizer(root / "sound_tokenizer", seed)
    return root


def mismatch_weights(root: Path, how: str, component: str = "vae") -> Path:
    """Rename (``how="renamed"``) or misshape (``"misshapen"``) the first tensor of ``root``'s ``component``'s
    weights (``vae``, ``sound_tokenizer``)."""
    from safetensors.torch import load_file, save_file

    path = Path(root) / component / "diffusion_pytorch_model.safetensors"
    tensors = load_file(path)
    key = min(tensors)
    if how == "renamed":
        tensors[f"{key}_renamed"] = tensors.pop(key)
    elif how == "misshapen":
        tensors[key] = torch.zeros(tensors[key].numel() + 1, dtype=tensors[key].dtype)
    else:
        raise ValueError(f"how={how!r}: expected 'renamed' or 'misshapen'")
    save_file(tensors, path)
    return root
