"""Typed views of a Cosmos3 ``transformer/config.json`` and its ``quantization_config``, and of the configs of
its VAE (``vae/config.json``) and sound tokenizer.

This module is torch-free so the farm driver can validate manifests against a checkpoint
without a GPU stack. Values we cannot run exactly are refused here, once, with the fix.
"""

from __future__ import annotations

import fnmatch
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cosmos3.errors import ConfigError
from cosmos3.rules.checkpoint_files import read_json
from cosmos3.rules.values import is_int, is_real


@dataclass(frozen=True)
class QuantConfig:
    """The parts of ``quantization_config`` that decide how Linears compute (docs/checkpoints.md §5.3)."""

    quant_method: str
    quant_algo: str
    static_input: bool  # config_groups.*.input_activations.dynamic == false
    weight_only: bool
    ignore: tuple[str, ...] = ()  # globs in the checkpoint namespace
    modules_to_not_convert: tuple[str, ...] = ()  # name components or prefixes
    runtime: dict | None = None  # raw ``runtime``; step_precision.py parses it strictly

    @classmethod
    def from_dict(cls, raw: Any) -> QuantConfig:
        """Parse ``quantization_config`` strictly by type: a malformed one is refused with the field named."""
        if not isinstance(raw, dict):
            raise ConfigError(
                f"quantization_config must be an object such as ModelOpt writes ({{quant_method, quant_algo, "
                f"config_groups, ignore, ...}}), got {raw!r}"
            )
        groups = _typed(raw, "config_groups", dict, {})
        for name, group in groups.items():
            where = f"config_groups.{name}"
            if not isinstance(group, dict):
                raise ConfigError(f"quantization_config.{where} must be an object, got {group!r}")
            activations = group.get("input_activations")
            if activations is not None and not isinstance(activations, dict):
                raise ConfigError(f"quantization_config.{where}.input_activations must be an object or null, "
                                  f"got {activations!r}")
        static_input = bool(groups) and all(
            g.get("input_activations") is not None and g["input_activations"].get("dynamic") is False
            for g in groups.values()
        )
        return cls(
            quant_method=_typed(raw, "quant_method", str, ""),
            quant_algo=_typed(raw, "quant_algo", str, ""),
            static_input=static_input,
            weight_only=_typed(raw, "weight_only", bool, False),
            ignore=_string_list(raw, "ignore"),
            modules_to_not_convert=_string_list(raw, "modules_to_not_convert"),
            runtime=raw.get("runtime"),
        )

    def is_ignored(self, module_name: str) -> bool:
        """True when ``module_name`` (checkpoint namespace, e.g. ``layers.3.mlp.down_proj``) stays high precision."""
        first = module_name.split(".")[0]
        for pattern in self.ignore:
            if fnmatch.fnmatchcase(module_name, pattern) or fnmatch.fnmatchcase(first, pattern):
                return True
        parts = module_name.split(".")
        return any(name in parts or module_name.startswith(name + ".") for name in self.modules_to_not_convert)


def _typed(raw: dict, key: str, kind: type, default: Any) -> Any:
    """``raw[key]`` if it has type ``kind`` (null or absent: ``default``); else a ConfigError naming the field."""
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ConfigError(f"quantization_config.{key} must be {_KIND_NAMES[kind]}, got {value!r}")
    return value


def _string_list(raw: dict, key: str) -> tuple[str, ...]:
    values = _typed(raw, key, list, [])
    if not all(isinstance(v, str) for v in values):
        raise ConfigError(f"quantization_config.{key} must be a list of module names or globs, got {values!r}")
    return tuple(values)


_KIND_NAMES = {str: "a string", bool: "true or false", dict: "an object", list: "a list", int: "an integer",
               float: "a number"}


def uses_static_fp8(config: Cosmos3Config | QuantConfig | dict | None) -> bool:
    """The one predicate for ModelOpt static per-tensor FP8 (W8A8 with calibrated input scales).

    Accepts a parsed config, a QuantConfig, a raw config.json dict or a raw quantization_config dict.
    """
    if isinstance(config, Cosmos3Config):
        config = config.quantization
    elif isinstance(config, dict):
        raw = config.get("quantization_config", config)
        config = QuantConfig.from_dict(raw) if raw else None
    if config is None:
        return False
    return (
        config.quant_method == "modelopt"
        and "FP8" in config.quant_algo
        and config.static_input
        and not config.weight_only
    )


@dataclass(frozen=True)
class Cosmos3Config:
    """``Cosmos3OmniTransformer`` config.json; defaults are the published Nano values (docs/checkpoints.md §2)."""

    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    attention_bias: bool = False
    rms_norm_eps: float = 1e-6
    vocab_size: int = 151936
    rope_theta: float = 5_000_000.0
    rope_axes_dim: tuple[int, int, int] = (24, 20, 20)  # mrope_section: T, H, W frequency counts
    position_embedding_type: str = "unified_3d_mrope"
    unified_3d_mrope_reset_spatial_ids: bool = True
    unified_3d_mrope_temporal_modality_margin: int = 15000
    latent_channel: int = 48
    latent_patch_size: int = 2
    patch_latent_dim: int = 192  # latent_channel * latent_patch_size**2
    timestep_scale: float = 0.001
    base_fps: float = 24.0
    enable_fps_modulation: bool = True
    qk_norm_for_text: bool = True
    use_und_k_norm_for_gen: bool = False
    joint_attn_implementation: str = "two_way"
    sound_gen: bool = False
    sound_dim: int | None = None
    sound_latent_fps: float = 25.0
    action_gen: bool = False
    action_dim: int | None = None
    num_embodiment_domains: int = 32
    quantization: QuantConfig | None = None
    extra: dict = field(default_factory=dict, compare=False)  # keys we read but do not use

    @classmethod
    def from_dict(cls, raw: dict) -> Cosmos3Config:
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json must hold a JSON object, got {type(raw).__name__}")
        names = {f.name for f in fields(cls)} - {"quantization", "extra"}
        values: dict[str, Any] = {k: v for k, v in raw.items() if k in names}
        rope = raw.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"rope_scaling must be an object, got {rope!r}")
        for name, value in values.items():
            values[name] = _check_field(name, _FIELD_TYPES[name], value)
        if "rope_axes_dim" not in values and "mrope_section" in rope:
            values["rope_axes_dim"] = _check_field("rope_scaling.mrope_section", _FIELD_TYPES["rope_axes_dim"],
                                                   rope["mrope_section"])
        quant = raw.get("quantization_config")
        values["quantization"] = QuantConfig.from_dict(quant) if quant not in (None, {}) else None
        values["extra"] = {k: v for k, v in raw.items() if k not in names}
        config = cls(**values)
        config.validate()
        return config

    @classmethod
    def from_json(cls, path: str | Path) -> Cosmos3Config:
        path = Path(path)
        raw = _read_json(path, "no transformer config.json here (pass the checkpoint root or its transformer/ dir)")
        try:
            return cls.from_dict(raw)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    def validate(self) -> None:
        """Refuse every config value this implementation does not compute exactly."""
        if self.hidden_act != "silu":
            raise ConfigError(
                f"hidden_act={self.hidden_act!r} (the Cosmos3-Edge relu2 backbone) is not supported yet; "
                "only the Nano/Super 'silu' backbone is"
            )
        if self.joint_attn_implementation != "two_way":
            raise ConfigError(
                f"joint_attn_implementation={self.joint_attn_implementation!r} is not supported; only 'two_way' is"
            )
        if self.position_embedding_type != "unified_3d_mrope":
            raise ConfigError(
                f"position_embedding_type={self.position_embedding_type!r} is not supported; "
                "only 'unified_3d_mrope' is"
            )
        if not self.qk_norm_for_text or self.use_und_k_norm_for_gen:
            raise ConfigError("only qk_norm_for_text=true with use_und_k_norm_for_gen=false (Nano/Super) is supported")
        if not self.unified_3d_mrope_reset_spatial_ids:
            raise ConfigError("unified_3d_mrope_reset_spatial_ids=false is not supported; the published value is true")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.patch_latent_dim != self.latent_channel * self.latent_patch_size**2:
            raise ConfigError(
                f"patch_latent_dim={self.patch_latent_dim} must equal latent_channel*latent_patch_size^2 = "
                f"{self.latent_channel * self.latent_patch_size ** 2}"
            )
        if self.sound_gen and not self.sound_dim:
            raise ConfigError("sound_gen=true needs sound_dim")
        if self.action_gen and not self.action_dim:
            raise ConfigError("action_gen=true needs action_dim")


SOUND_TOKENIZER_DIR = "sound_tokenizer"
SOUND_TOKENIZER_CLASS = "Cosmos3AVAEAudioTokenizer"


@dataclass(frozen=True)
class SoundConfig:
    """What sound generation needs from a checkpoint: the transformer's sound head and
    ``sound_tokenizer/config.json``."""

    sound_dim: int  # channels of a sound latent frame (== the tokenizer's vocoder_input_dim)
    latent_fps: float  # transformer sound_latent_fps: the frame rate of the sound tokens' positions
    sampling_rate: int  # Hz of the decoded waveform
    hop_size: int  # waveform samples per latent frame (diffusers: hop_size, else prod(dec_strides))
    channels: int  # decoded audio channels (dec_out_channels; 2 = stereo)

    def samples(self, frames: int, fps: float) -> int:
        """Waveform samples of a clip of ``frames`` at ``fps``: ``int(frames / fps * rate)``, as diffusers sizes
        them."""
        return int(frames / fps * self.sampling_rate)

    def latent_frames(self, frames: int, fps: float) -> int:
        """Sound latent frames of a clip: its samples over the hop, rounded up (diffusers' ``prepare_latents``)."""
        return -(-self.samples(frames, fps) // self.hop_size)


@dataclass(frozen=True)
class SoundSupport:
    """Whether a checkpoint can generate sound: its ``config``, or ``missing`` naming what it lacks."""

    config: SoundConfig | None
    missing: str = ""


def _read_json(path: Path, missing: str) -> Any:
    """The JSON value in ``path``, read as a bounded regular file; a ConfigError naming the file when it is absent
    (``missing`` says what it is for) or unreadable."""
    return read_json(path, missing, ConfigError)


def _positive_int(raw: dict, key: str, path: Path) -> int:
    value = raw.get(key)
    if not is_int(value) or value <= 0:
        raise ConfigError(f"{path}: {key}={value!r} must be a positive whole number")
    return value


def read_sound_support(root: str | Path, transformer: Cosmos3Config) -> SoundSupport:
    """Read ``<root>/sound_tokenizer/config.json`` beside a parsed transformer config; torch-free.

    A checkpoint without ``sound_gen`` or without the folder simply has no sound; a folder whose
    config is unreadable or disagrees with the transformer is an error naming the file.
    """
    if not transformer.sound_gen:
        return SoundSupport(None, "its transformer has sound_gen=false")
    folder = Path(root) / SOUND_TOKENIZER_DIR
    if not folder.is_dir():
        return SoundSupport(None, f"it ships no {SOUND_TOKENIZER_DIR}/ folder")
    path = folder / "config.json"
    raw = _read_json(path, f"missing (a {SOUND_TOKENIZER_DIR}/ folder needs its {SOUND_TOKENIZER_CLASS} config)")
    if not isinstance(raw, dict) or raw.get("_class_name", SOUND_TOKENIZER_CLASS) != SOUND_TOKENIZER_CLASS:
        found = raw.get("_class_name") if isinstance(raw, dict) else type(raw).__name__
        raise ConfigError(f"{path}: expected a {SOUND_TOKENIZER_CLASS} config, got {found!r}")
    strides = raw.get("dec_strides", (2, 4, 5, 6, 8))  # diffusers' default decoder
    if raw.get("hop_size") is not None:
        hop = _positive_int(raw, "hop_size", path)
    elif isinstance(strides, list | tuple) and strides and all(isinstance(s, int) and s > 0 for s in strides):
        hop = 1
        for stride in strides:
            hop *= stride
    else:
        raise ConfigError(f"{path}: dec_strides={strides!r} must be a list of positive whole numbers")
    dim = raw.get("vocoder_input_dim", 64)
    if dim != transformer.sound_dim:
        raise ConfigError(
            f"{path}: vocoder_input_dim={dim!r} does not match the transformer's sound_dim={transformer.sound_dim} "
            "(the sound tokenizer must decode the latents this transformer makes)"
        )
    raw = {"sampling_rate": 48000, "dec_out_channels": 2, **raw}
    return SoundSupport(SoundConfig(
        sound_dim=transformer.sound_dim, latent_fps=float(transformer.sound_latent_fps),
        sampling_rate=_positive_int(raw, "sampling_rate", path), hop_size=hop,
        channels=_positive_int(raw, "dec_out_channels", path),
    ))


VAE_DIR = "vae"
TEXT_TOKENIZER_DIR = "text_tokenizer"
VAE_CLASS = "AutoencoderKLWan"
@dataclass(frozen=True)
class VAEConfig:
    """What the pipeline and the request rules take from ``vae/config.json``, read without diffusers: the one
    reader behind ``farm validate``, the request rules and a worker's start checks."""

    z_dim: int  # latent channels; the transformer's latent_channel must match
    spatial_factor: int  # scale_factor_spatial: width and height are multiples of it
    temporal_factor: int  # scale_factor_temporal: a clip has temporal_factor*k + 1 frames
    latents_mean: tuple[float, ...]  # z_dim entries: the transformer sees (mu - latents_mean) / latents_std
    latents_std: tuple[float, ...]  # z_dim entries

    @classmethod
    def from_json(cls, path: str | Path) -> VAEConfig:
        """Parse strictly: every field present and typed, latents_mean and latents_std with z_dim entries each."""
        path = Path(path)
        raw = _read_json(path, f"missing (a {VAE_DIR}/ folder needs its {VAE_CLASS} config)")
        if not isinstance(raw, dict) or raw.get("_class_name", VAE_CLASS) != VAE_CLASS:
            found = raw.get("_class_name") if isinstance(raw, dict) else type(raw).__name__
            raise ConfigError(f"{path}: expected a {VAE_CLASS} config, got {found!r}")
        z_dim = _positive_int(raw, "z_dim", path)
        mean, std = _numbers(raw, "latents_mean", path), _numbers(raw, "latents_std", path)
        if len(mean) != z_dim or len(std) != z_dim:
            raise ConfigError(f"{path}: latents_mean and latents_std need z_dim={z_dim} entries each, "
                              f"got {len(mean)} and {len(std)}")
        return cls(z_dim, _positive_int(raw, "scale_factor_spatial", path),
                   _positive_int(raw, "scale_factor_temporal", path), mean, std)

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``[C, T', H', W']`` of a clip of ``frames`` pixel frames."""
        return (self.z_dim, (frames - 1) // self.temporal_factor + 1, height // self.spatial_factor,
                width // self.spatial_factor)


def _numbers(raw: dict, key: str, path: Path) -> tuple[float, ...]:
    value = raw.get(key)
    if not isinstance(value, list) or not all(is_real(v) for v in value):
        raise ConfigError(f"{path}: {key}={value!r} must be a list of numbers")
    return tuple(float(v) for v in value)


def _check_field(name: str, kind: Any, value: Any) -> Any:
    """``value`` as field ``name`` of type ``kind`` wants it, or a ConfigError: ``"192"`` is not an int.

    JSON has no int/float split for floats (``24`` is a valid ``base_fps``), but a string, or a bool
    where a number belongs, is a writer's bug we refuse rather than coerce.
    """
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # ``int | None``
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        (kind,) = [o for o in options if o is not type(None)]
    if typing.get_origin(kind) is tuple:
        items = typing.get_args(kind)
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            raise ConfigError(f"{name} must be a list of {len(items)} integers, got {value!r}")
        pairs = enumerate(zip(items, value, strict=True))
        return tuple(_check_field(f"{name}[{i}]", item, v) for i, (item, v) in pairs)
    ok = {
        bool: isinstance(value, bool),
        int: is_int(value),
        float: is_real(value),
        str: isinstance(value, str),
    }[kind]
    if not ok:
        raise ConfigError(f"{name} must be {_KIND_NAMES[kind]}, got {value!r} ({type(value).__name__})")
    return float(value) if kind is float else value


_FIELD_TYPES = typing.get_type_hints(Cosmos3Config)
