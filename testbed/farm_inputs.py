"""The inputs of a farm run, for the farm's tests and benchmarks: a checkpoint folder a manifest can read (every
config and header validation reads, stand-in weights), small manifests, and input media for I2V and V2V."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from toy.layout import PROMPT_WORDS, write_pipeline_files, write_tokenizer

STATIC_FP8_QUANT = {
    "quant_method": "modelopt", "quant_algo": "FP8", "quant_type": "FP8_FP8", "weight_only": False,
    "config_groups": {"group_0": {"weights": {"dynamic": False, "num_bits": 8, "type": "float"},
                                  "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                                  "targets": ["Linear"]}},
}


TEXT_VOCAB = 151_936  # the transformer config's vocab_size (the published default)
# The transformer's config: its latents are the VAE's (latent_channel = z_dim, patch_latent_dim = z_dim * 2 * 2).
TRANSFORMER = {"_class_name": "Cosmos3OmniTransformer", "hidden_size": 32, "latent_channel": 4, "patch_latent_dim": 16}
UNIPC = {"_class_name": "UniPCMultistepScheduler", "prediction_type": "flow_prediction", "use_flow_sigmas": True}
VAE = {"_class_name": "AutoencoderKLWan", "z_dim": 4, "latents_mean": [0.0, 0.1, -0.1, 0.2],
       "latents_std": [1.0, 0.9, 1.1, 0.8], "scale_factor_spatial": 16, "scale_factor_temporal": 4}
# A sound tokenizer's config: 8 kHz over a 320-sample hop, stereo (what sizes a clip's sound).
SOUND_TOKENIZER = {"_class_name": "Cosmos3AVAEAudioTokenizer", "sampling_rate": 8000, "vocoder_input_dim": 8,
                   "dec_strides": [4, 8, 10], "dec_out_channels": 2}


def make_checkpoint(root: Path, *, static_fp8: bool = False, scheduler: dict = UNIPC, sound: bool = False) -> Path:
    """Just enough of the published layout for the driver and the fake pipelines, which load no weights: every
    component a worker loads (model_index.json, the text tokenizer), the configs cosmos3 checks requests and
    load options against (transformer, scheduler, VAE, sound tokenizer) and whole safetensors files, which
    validation reads the headers of."""
    config: dict[str, Any] = dict(TRANSFORMER)
    if static_fp8:
        config["quantization_config"] = STATIC_FP8_QUANT
    files = [("transformer/config.json", config), ("vae/config.json", VAE)]
    if sound:
        config.update(sound_gen=True, sound_dim=SOUND_TOKENIZER["vocoder_input_dim"])
        files.append(("sound_tokenizer/config.json", SOUND_TOKENIZER))
    write_pipeline_files(root, scheduler, sound=sound)  # model_index.json and scheduler/
    write_tokenizer(root / "text_tokenizer", PROMPT_WORDS, vocab_size=TEXT_VOCAB)
    for path, data in files:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(json.dumps(data))
    write_weights(root / "transformer", static_fp8=static_fp8)
    for decoder in ("vae", "sound_tokenizer") if sound else ("vae",):
        write_decoder_weights(root / decoder)
    return root


def write_decoder_weights(directory: Path) -> Path:
    """A whole safetensors file where the VAE's (or sound tokenizer's) weights go: validation reads its header,
    no fake loads it."""
    import torch
    from safetensors.torch import save_file

    save_file({"decoder.conv_out.bias": torch.zeros(3)}, directory / "diffusion_pytorch_model.safetensors")
    return directory


def write_weights(directory: Path, *, static_fp8: bool) -> Path:
    """One shard of stand-in tensors: a norm, and for static FP8 one e4m3 projection with its per-tensor scales."""
    import torch
    from safetensors.torch import save_file

    tensors = {"norm_moe_gen.weight": torch.ones(32, dtype=torch.bfloat16)}
    if static_fp8:
        tensors |= {"layers.0.self_attn.to_q.weight": torch.zeros(32, 32).to(torch.float8_e4m3fn),
                    "layers.0.self_attn.to_q.weight_scale": torch.tensor(0.01),
                    "layers.0.self_attn.to_q.input_scale": torch.tensor(0.02)}
    for old in directory.glob("*.safetensors"):
        old.unlink()
    save_file(tensors, directory / "diffusion_pytorch_model.safetensors")
    return directory


def write_image(path: Path) -> Path:
    """A small real PNG: validation decodes an I2V input's header."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 16), (200, 30, 30)).save(path)
    return path


def write_video(path: Path) -> Path:
    """A short real MP4: validation reads a V2V input's header."""
    import imageio.v3 as iio
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, np.zeros((9, 32, 32, 3), np.uint8), fps=8)
    return path


def write_manifest(folder: Path, jobs: list[dict], *, name: str = "test", defaults: dict | None = None,
                   model: dict | None = None, output: dict | None = None, sound: bool = False) -> Path:
    """A small, fast manifest in `folder` (tiny frames, few steps) with a checkpoint beside it (`sound`: one
    that generates sound)."""
    make_checkpoint(folder / "ckpt", sound=sound)
    doc = {
        "version": 1, "name": name,
        "model": {"checkpoint": "ckpt", **(model or {})},
        "output": {"root": "out", **(output or {})},
        "defaults": {"size": [32, 32], "frames": 5, "fps": 8, "steps": 4, "retries": 2, **(defaults or {})},
        "jobs": jobs,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
