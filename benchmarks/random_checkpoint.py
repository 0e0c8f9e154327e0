"""A random-weight Cosmos3 checkpoint in the published layout, written tensor by tensor, shard by shard.

    stats = write_checkpoint(root, variant="fp8", device="cuda")   # Nano: ~16 GB on disk in ~a minute
    stats = write_checkpoint(root, variant="bf16", transformer=TINY, vae=TINY_VAE)   # tests, on CPU

A Nano-size model does not fit a BF16 copy in host memory next to everything else on the benchmark
machine, so nothing is built whole: tensor names and shapes come from diffusers'
``Cosmos3OmniTransformer`` on the meta device (the published key names, docs/checkpoints.md §1.1), each tensor
is drawn on ``device`` from its own seed, and a shard is written as soon as it is full. Peak host
memory is one shard.

Both variants hold the *same* model: a decoder projection is drawn in fp32, quantized per tensor
(``weight_scale = amax / 448``, e4m3), and the BF16 variant stores that FP8 weight dequantized, so
ours-FP8, ours-BF16 and diffusers-BF16 run one set of weights.

Layout (docs/checkpoints.md §1, §5.2): ``model_index.json``; ``transformer/`` (shards, index, config.json with
the Nano values of docs/checkpoints.md §2 and, for FP8, the ``quantization_config`` ModelOpt 0.47 exports:
``weight_scale``/``input_scale`` 0-d fp32 beside each e4m3 weight, no ``_amax`` buffers, plus the
published ``diffusion_step_policy``); ``hf_quant_config.json`` (FP8: the same without ``runtime``);
``vae/`` (``AutoencoderKLWan``, the Wan 2.2 config, z_dim 48, random weights); ``text_tokenizer/``
(word-level, ChatML template, loads through ``AutoTokenizer``); ``scheduler/`` (UniPC, flow sigmas).
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY
from cosmos3.ops import FP8, FP8_MAX
from cosmos3.rules.config import QuantConfig
from testbed.wan_vae import WAN22_VAE
from toy.layout import (
    DISTILLED_SCHEDULER,
    PROMPT_WORDS,
    PUBLISHED_ONLY_KEYS,
    UNIPC_SCHEDULER,
    write_json,
    write_pipeline_files,
    write_tokenizer,
)

# Nano transformer/config.json (docs/checkpoints.md §2); keys diffusers' constructor takes.
NANO = {
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "attention_bias": False,
    "attention_dropout": 0.0, "rms_norm_eps": 1e-6, "vocab_size": 151936, "rope_theta": 5000000.0,
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
    "unified_3d_mrope_reset_spatial_ids": True, "unified_3d_mrope_temporal_modality_margin": 15000,
    "latent_channel": 48, "latent_patch_size": 2, "patch_latent_dim": 192, "timestep_scale": 0.001,
    "base_fps": 24, "enable_fps_modulation": True, "qk_norm_for_text": True,
    "sound_gen": True, "sound_dim": 64, "sound_latent_fps": 25, "action_gen": True, "action_dim": 64,
    "num_embodiment_domains": 32,
}
# Super: the Nano keys with Super's backbone (docs/models.md says which values are published and which inferred).
SUPER = {**NANO, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
         "num_key_value_heads": 8, "head_dim": 128}
# Published-only keys of the same file that diffusers' constructor does not take.
NANO_EXTRA = {**PUBLISHED_ONLY_KEYS, "_diffusers_version": "0.37.1", "temporal_compression_factor_sound": 1,
              "max_action_dim": 64}


# What ModelOpt 0.47's Hugging Face export writes into transformer/config.json, and nothing more.
MODELOPT_VERSION = "0.47.0"
_FP8_TENSORS = {"dynamic": False, "num_bits": 8, "type": "float"}
# The published FP8 checkpoints' ignore list (docs/checkpoints.md §5.3): what the cosmos recipe leaves high precision.
PUBLISHED_IGNORE = ["proj_in", "proj_out", "time_embedder*", "audio_proj_in", "audio_proj_out", "action_proj_in",
                    "action_proj_out", "lm_head", "model.visual*", "visual*"]
MODELOPT_QUANTIZATION = {
    "config_groups": {"group_0": {"weights": _FP8_TENSORS, "input_activations": _FP8_TENSORS, "targets": ["Linear"]}},
    "ignore": PUBLISHED_IGNORE,
    "quant_algo": "FP8",
    "producer": {"name": "modelopt", "version": MODELOPT_VERSION},
    "quant_method": "modelopt",
}

INIT_STD = 0.02  # initializer_range of the published config
# Random weights have no calibration data: every projection reads activations of about this size
# (RMSNorm outputs with unit gains peak near 5). One value keeps each group's shared scale equal.
INPUT_AMAX = 8.0
SHARD_BYTES = 5 << 30  # the published Nano shards are ~5 GB


@dataclass(frozen=True)
class Build:
    """One of the six published static-FP8 builds (docs/models.md): what its files say beside the weights."""

    transformer: dict  # transformer/config.json's model keys
    step_policy: bool  # quantization_config.runtime.diffusion_step_policy present
    scheduler: dict  # scheduler/scheduler_config.json
    pipeline_tag: str | None = None  # README.md's front matter (cosmos3.rules.model_card); None: no card


BUILDS = {
    "nano": Build(NANO, True, UNIPC_SCHEDULER),
    "super": Build(SUPER, True, UNIPC_SCHEDULER),
    "super-i2v": Build(SUPER, True, UNIPC_SCHEDULER, "image-to-video"),
    "super-t2i": Build(SUPER, False, UNIPC_SCHEDULER, "text-to-image"),
    "super-t2i-4step": Build(SUPER, False, DISTILLED_SCHEDULER, "text-to-image"),
    "super-i2v-4step": Build(SUPER, False, DISTILLED_SCHEDULER, "image-to-video"),
}


@dataclass(frozen=True)
class Entry:
    key: str  # published name, e.g. layers.3.mlp.down_proj.weight
    shape: tuple[int, ...]
    dtype: torch.dtype  # as stored
    projection: bool = False  # a decoder projection weight: FP8 (+ two 0-d fp32 scales) in the FP8 variant

    @property
    def nbytes(self) -> int:
        scales = 8 if self.dtype == FP8 else 0
        return torch.Size(self.shape).numel() * torch.empty((), dtype=self.dtype).element_size() + scales


@dataclass
class WriteStats:
    bytes: int  # transformer shards
    seconds: float
    shards: int

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9


def _reference_model(transformer: dict):
    from diffusers import Cosmos3OmniTransformer

    with torch.device("meta"):  # names and shapes only: no memory, no init
        return Cosmos3OmniTransformer(**transformer)


def plan_entries(transformer: dict, variant: str) -> list[Entry]:
    """Every parameter of ``transformer/`` in diffusers' order, with its stored dtype."""
    if variant not in ("fp8", "bf16"):
        raise ValueError(f"variant must be 'fp8' or 'bf16', got {variant!r}")
    model = _reference_model(transformer)
    rules = QuantConfig.from_dict(MODELOPT_QUANTIZATION)
    entries = []
    for key, param in model.named_parameters():
        module, _, suffix = key.rpartition(".")
        projection = (module.startswith("layers.") and suffix == "weight" and not rules.is_ignored(module)
                      and isinstance(model.get_submodule(module), torch.nn.Linear))
        if projection and variant == "fp8":
            dtype = FP8
        else:
            dtype = torch.float32 if key.startswith("time_embedder.") else torch.bfloat16  # diffusers keeps it fp32
        entries.append(Entry(key, tuple(param.shape), dtype, projection))
    return entries


def _generator(key: str, seed: int, device: torch.device) -> torch.Generator:
    # One stream per tensor name: a tensor does not depend on the order or the variant it is written in.
    return torch.Generator(device).manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))


def draw(key: str, shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """The fp32 random value of one tensor: norm gains near 1, everything else ``N(0, 0.02^2)``."""
    noise = torch.randn(shape, generator=_generator(key, seed, device), device=device, dtype=torch.float32)
    if "norm" in key.rpartition(".")[0].rsplit(".", 1)[-1]:  # RMSNorm gains: norm_q, input_layernorm, ...
        return 1.0 + 0.05 * noise
    return INIT_STD * noise


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor static FP8 as ModelOpt exports it: ``(e4m3 [out, in], weight_scale 0-d fp32)``."""
    scale = (weight.abs().amax() / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (weight / scale).to(FP8), scale.reshape(())  # |w / scale| <= 448: the cast never saturates


def tensors_of(entry: Entry, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``entry``'s stored tensor(s); an FP8 weight comes with its ``weight_scale`` and ``input_scale``."""
    value = draw(entry.key, entry.shape, seed, device)
    if not entry.projection:
        return {entry.key: value.to(entry.dtype)}
    weight, scale = quantize(value)
    if entry.dtype != FP8:
        return {entry.key: (weight.float() * scale).to(entry.dtype)}  # the BF16 variant: the FP8 model, dequantized
    module = entry.key.rpartition(".")[0]
    input_scale = torch.tensor(INPUT_AMAX / FP8_MAX, dtype=torch.float32, device=device)
    return {entry.key: weight, f"{module}.weight_scale": scale, f"{module}.input_scale": input_scale}


def _shards(entries: list[Entry], shard_bytes: int) -> list[list[Entry]]:
    """Consecutive entries, a new shard once one is full, as diffusers' save_pretrained splits."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for entry in entries:
        if shards[-1] and size + entry.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += entry.nbytes
    return shards


def write_transformer(directory: Path, *, variant: str, transformer: dict = NANO, seed: int = 0,
                      device: str | torch.device = "cpu", shard_bytes: int = SHARD_BYTES,
                      step_policy: bool = True) -> WriteStats:
    """``transformer/``: safetensors shards, their index and config.json, one shard in memory at a time."""
    from safetensors.torch import save_file

    started = time.perf_counter()
    device = torch.device(device)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors*"):
        old.unlink()
    plan = _shards(plan_entries(transformer, variant), shard_bytes)
    names = [f"diffusion_pytorch_model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    weight_map, total = {}, 0
    for name, shard in zip(names, plan, strict=True):
        content = {}
        for entry in shard:
            for key, tensor in tensors_of(entry, seed, device).items():
                content[key] = tensor.cpu()
                weight_map[key] = name
        save_file(content, directory / name, metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in content.values())
        del content
    write_json(directory / "diffusion_pytorch_model.safetensors.index.json",
               {"metadata": {"total_size": total}, "weight_map": weight_map})
    write_json(directory / "config.json", transformer_config(transformer, variant, step_policy))
    return WriteStats(total, time.perf_counter() - started, len(plan))


def quantization_config(step_policy: bool = True) -> dict:
    """ModelOpt 0.47's export, plus the published step policy where the build carries one (docs/models.md)."""
    if not step_policy:
        return dict(MODELOPT_QUANTIZATION)
    return {**MODELOPT_QUANTIZATION, "runtime": {"diffusion_step_policy": PUBLISHED_STEP_POLICY}}


def transformer_config(transformer: dict, variant: str, step_policy: bool = True) -> dict:
    config = {"_class_name": "Cosmos3OmniTransformer", **NANO_EXTRA, **transformer}
    if variant == "fp8":
        config["quantization_config"] = quantization_config(step_policy)
    return config


def write_vae(directory: Path, *, vae: dict = WAN22_VAE, seed: int = 0, device: str | torch.device = "cpu") -> None:
    """``vae/``: diffusers ``AutoencoderKLWan`` with its own (random) initialisation, fp32."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    with torch.device(device):  # initialise where it is fast; save_pretrained moves to the host per tensor
        model = AutoencoderKLWan(**vae)
    model.save_pretrained(str(directory), safe_serialization=True)


def write_checkpoint(root: str | Path, *, variant: str = "fp8", transformer: dict = NANO, vae: dict = WAN22_VAE,
                     words: tuple[str, ...] = (), seed: int = 0, device: str | torch.device = "cpu",
                     shard_bytes: int = SHARD_BYTES, build: Build | None = None) -> WriteStats:
    """The whole checkpoint root. ``words``: prompt words the tokenizer should know (others map to [UNK]).

    ``build``: one of ``BUILDS`` (its transformer replaces ``transformer``); None: Nano's files around
    ``transformer``.
    """
    root = Path(root)
    build = build or Build(transformer, True, UNIPC_SCHEDULER)
    stats = write_transformer(root / "transformer", variant=variant, transformer=build.transformer, seed=seed,
                              device=device, shard_bytes=shard_bytes, step_policy=build.step_policy)
    write_vae(root / "vae", vae=vae, seed=seed, device=device)
    vocabulary = dict.fromkeys([*PROMPT_WORDS, *(w.lower() for w in words)])
    write_tokenizer(root / "text_tokenizer", list(vocabulary), vocab_size=build.transformer["vocab_size"])
    write_pipeline_files(root, build.scheduler)
    write_build_files(root, build)
    if variant == "fp8":
        (root / "hf_quant_config.json").write_text(json.dumps(MODELOPT_QUANTIZATION, indent=2) + "\n")
    return stats


def write_build_files(root: Path, build: Build) -> None:
    """The files that tell the builds apart beside the scheduler: the distilled builds' ``modular_model_index.json``
    (``is_distilled``, ``distilled_sigmas``: the scheduler's ``t_list``) and the model card's ``pipeline_tag``."""
    fixed = build.scheduler.get("fixed_step_sampler_config")
    if fixed:
        write_json(root / "modular_model_index.json", {"is_distilled": True, "distilled_sigmas": fixed["t_list"]})
    if build.pipeline_tag:
        (root / "README.md").write_text(f"---\npipeline_tag: {build.pipeline_tag}\nlibrary_name: diffusers\n---\n\n"
                                        "Random weights in the published layout (benchmarks/random_checkpoint.py).\n")


def link_build(source: str | Path, root: str | Path, build: Build, variant: str = "fp8") -> None:
    """``root``: the checkpoint of ``build`` made from ``source`` (a checkpoint ``write_checkpoint`` wrote with the same
    transformer shape) by hard links, so the builds share one copy of the weights on disk (the six published builds
    differ in their files, not in the shape of their weights); the files that tell builds apart are written anew."""
    import os

    source, root = Path(source), Path(root)
    written = json.loads((source / "transformer" / "config.json").read_text())
    if any(written.get(key) != value for key, value in build.transformer.items()):
        raise ValueError(f"{source}'s transformer is not the shape of this build; write it with write_checkpoint")
    own = {"transformer/config.json", "scheduler/scheduler_config.json", "model_index.json",
           "modular_model_index.json", "README.md"}
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        if path.is_file() and relative not in own and not path.name.startswith("."):
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                target.unlink()
            os.link(path, target)
    write_json(root / "transformer" / "config.json", transformer_config(build.transformer, variant, build.step_policy))
    for stale in ("modular_model_index.json", "README.md"):
        (root / stale).unlink(missing_ok=True)
    write_pipeline_files(root, build.scheduler)
    write_build_files(root, build)
