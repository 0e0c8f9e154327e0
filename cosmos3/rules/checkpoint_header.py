"""What a Cosmos3 transformer checkpoint holds, read from its JSON and safetensors headers alone.

Torch-free, so ``farm validate`` runs the same checks the loader runs: a checkpoint refused at
load is refused at validation, with the same message naming the file and the field.

    facts = inspect("/ckpt/Cosmos3-Nano")     # root or its transformer/ dir
    facts.config, facts.tensors["proj_in.weight"].dtype, facts.fp8_modules

* ``config.json``: strict types (``cosmos3.rules.config``); a malformed ``quantization_config`` is refused.
* Shards: the index's ``weight_map`` is followed (a tensor may live in any shard); every shard it
  names must exist, and every header must be whole: its length fits the file, it is JSON, and the
  tensors it lists end exactly at the end of the file (a truncated download does not).
* Which Linears are FP8 is read from the checkpoint, as vLLM does for ModelOpt configs: a module
  whose ``weight`` is e4m3 runs W8A8 with its own per-tensor ``weight_scale`` and ``input_scale``;
  ``quantization_config.ignore`` must agree. What we cannot honour is refused with the module named.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cosmos3.errors import CheckpointError
from cosmos3.rules import json_text
from cosmos3.rules.checkpoint_files import open_file, read_json
from cosmos3.rules.config import (
    SOUND_TOKENIZER_DIR,
    TEXT_TOKENIZER_DIR,
    VAE_DIR,
    Cosmos3Config,
    QuantConfig,
    SoundSupport,
    VAEConfig,
    read_sound_support,
    uses_static_fp8,
)
from cosmos3.rules.values import is_int

FP8_DTYPE = "F8_E4M3"
SCALES = ("weight_scale", "input_scale")

# Bytes per element of every safetensors dtype tag.
_ITEM_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own cap on the JSON header

# Present in published checkpoints, deliberately not loaded (generation never reads them).
SKIPPED = {
    "lm_head.weight": "the UND tower's LM head: generation never decodes text",
    "norm.weight": "the UND tower's final norm: predictions are read from GEN outputs only",
}


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its shard's header describes it."""

    key: str  # as stored (legacy or flat)
    file: Path | None  # the shard; None for tensors held in memory
    dtype: str  # safetensors tag: "BF16", "F8_E4M3", ...
    shape: tuple[int, ...]
    offset: int | None = None  # of its first data byte in the file; None in memory

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEM_SIZE[self.dtype]


@dataclass(frozen=True)
class CheckpointFacts:
    directory: Path  # the transformer/ directory
    config: Cosmos3Config
    tensors: dict[str, TensorHeader]  # by flat key (``normalize_key``)
    fp8_modules: frozenset[str]  # modules that run static W8A8


# Legacy (cosmos-framework) names -> diffusers flat names, per dotted component.
_LEGACY_ATTENTION = {
    "q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "o_proj": "to_out",
    "q_proj_moe_gen": "add_q_proj", "k_proj_moe_gen": "add_k_proj", "v_proj_moe_gen": "add_v_proj",
    "o_proj_moe_gen": "to_add_out",
    "q_norm": "norm_q", "k_norm": "norm_k", "q_norm_moe_gen": "norm_added_q", "k_norm_moe_gen": "norm_added_k",
}
_LEGACY_TOP = {
    "vae2llm": "proj_in", "llm2vae": "proj_out", "sound2llm": "audio_proj_in", "llm2sound": "audio_proj_out",
    "action2llm": "action_proj_in", "llm2action": "action_proj_out",
}
_LEGACY_TIME = {"mlp.0": "linear_1", "mlp.2": "linear_2"}


def normalize_key(key: str) -> str:
    """Map a legacy-layout key to the flat layout; flat keys pass through unchanged."""
    key = key.removeprefix("model.")
    parts = key.split(".")
    parts[0] = _LEGACY_TOP.get(parts[0], parts[0])
    if parts[0] == "time_embedder" and ".".join(parts[1:3]) in _LEGACY_TIME:
        parts[1:3] = [_LEGACY_TIME[".".join(parts[1:3])]]
    if len(parts) > 3 and parts[0] == "layers" and parts[2] == "self_attn":
        parts[3] = _LEGACY_ATTENTION.get(parts[3], parts[3])
    return ".".join(parts)


def transformer_dir(path: str | Path) -> Path:
    """Accept a checkpoint root (with ``transformer/``) or the transformer directory itself."""
    path = Path(path)
    return path / "transformer" if (path / "transformer").is_dir() else path


def inspect(path: str | Path) -> CheckpointFacts:
    """Everything the headers say about ``path``; raises ConfigError / CheckpointError naming file and field."""
    directory = transformer_dir(path)
    config = Cosmos3Config.from_json(directory / "config.json")
    tensors = read_tensors(directory)
    return CheckpointFacts(directory, config, tensors, fp8_modules(config, tensors, directory))


DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"  # a diffusers model's single weights file
# What a worker's pipeline loads, in the published layout (the sound tokenizer only where the transformer makes sound).
COMPONENTS = ("model_index.json", "transformer", VAE_DIR, TEXT_TOKENIZER_DIR, "scheduler")


# Read where the checkpoint has them: the sound tokenizer, and a distilled schedule's sigmas.
_OPTIONAL = (SOUND_TOKENIZER_DIR, "modular_model_index.json")


def listed_files(root: Path) -> list[Path]:
    """Every file of the checkpoint at ``root``, in a fixed order: what the pipeline loads and the fingerprint
    hashes (``cosmos3.rules.checkpoint_identity``). Each component's files (a file, or every file directly in its
    folder, hidden ones aside), the optional ones where present, and every shard the transformer's index names, also
    in a subfolder; nothing else under the folder (notes, renders) is part of the checkpoint.

    Raises CheckpointError (an index naming shards outside ``transformer/`` or missing ones).
    """
    found: set[Path] = set()
    for name in (*COMPONENTS, *_OPTIONAL):
        path = root / name
        if path.is_dir():
            found |= {p for p in path.iterdir() if not p.name.startswith(".") and not p.is_dir()}
        elif path.exists() or path.is_symlink():
            found.add(path)
    shards = index_shards(root / "transformer")
    if shards is not None:
        found |= {root / "transformer" / shard for shard in shards[1].values()}
    return sorted(found)


def check_layout(root: Path) -> None:
    """Every component of ``COMPONENTS`` is there; raises CheckpointError naming what is missing."""
    missing = [name for name in COMPONENTS if not (root / name).exists()]
    if missing:
        raise CheckpointError(
            f"{root}: not a Cosmos3 checkpoint in the published layout; missing {', '.join(missing)} "
            f"(expected {', '.join(COMPONENTS)})"
        )


def check_vae_dir(path: Path, latent_channel: int | None) -> VAEConfig:
    """Every check of a checkpoint's ``vae/`` that needs no diffusers: ``config.json`` parsed, its z_dim the
    transformer's ``latent_channel`` (None: a VAE loaded on its own), the weights present and their safetensors
    header whole. A worker's pipeline runs it before it loads anything, ``farm validate`` through
    ``RequestRules.from_checkpoint``: a ``vae/`` that passes fails only on what diffusers alone sees (a tensor
    the model does not have). Raises ConfigError / CheckpointError naming the file."""
    config = VAEConfig.from_json(path / "config.json")
    if latent_channel is not None and config.z_dim != latent_channel:
        raise CheckpointError(f"transformer latent_channel={latent_channel} does not match vae z_dim={config.z_dim} "
                              f"({path / 'config.json'}): the VAE must encode the latents this transformer denoises")
    check_diffusers_weights(path, "the VAE's weights")
    return config


def check_sound_dir(root: Path, transformer: Cosmos3Config) -> SoundSupport:
    """Every check of a checkpoint's ``sound_tokenizer/`` that needs no diffusers: ``read_sound_support``, then,
    where the checkpoint makes sound, its weights present and their header whole. ``farm validate`` and a worker's
    start both run it; raises ConfigError / CheckpointError naming the file."""
    sound = read_sound_support(root, transformer)
    if sound.config is not None:
        check_diffusers_weights(Path(root) / SOUND_TOKENIZER_DIR, "the sound tokenizer's weights")
    return sound


def check_diffusers_weights(path: Path, what: str) -> None:
    """A diffusers model folder's ``diffusion_pytorch_model.safetensors`` (``what`` it holds) is there and its
    header whole: a truncated or overwritten file fails here, torch-free, not in diffusers."""
    weights = path / DIFFUSERS_WEIGHTS
    if not weights.exists():  # whatever stands there is opened as a regular file or refused by name
        raise CheckpointError(f"{path}: no {DIFFUSERS_WEIGHTS} ({what})")
    read_header(weights)


# ---------------------------------------------------------------------------------- shards


def read_tensors(directory: Path) -> dict[str, TensorHeader]:
    """Flat key -> header of every tensor the index (or the single ``*.safetensors``) holds."""
    weight_map = _weight_map(directory)
    headers = {shard: read_header(directory / shard) for shard in sorted(set(weight_map.values()))}
    tensors: dict[str, TensorHeader] = {}
    for raw_key, shard in weight_map.items():
        if raw_key not in headers[shard]:
            raise CheckpointError(f"{directory / shard}: the index maps {raw_key!r} to this shard, whose header "
                                  "has no such tensor (the index and the shards come from different exports)")
        dtype, shape, offset = headers[shard][raw_key]
        key = normalize_key(raw_key)
        if key in tensors:
            raise CheckpointError(f"{directory}: {raw_key!r} and {tensors[key].key!r} both map to {key!r}")
        tensors[key] = TensorHeader(raw_key, directory / shard, dtype, shape, offset)
    return tensors


def _weight_map(directory: Path) -> dict[str, str]:
    """Stored key -> shard file (relative to ``directory``)."""
    shards = index_shards(directory)
    if shards is not None:
        return shards[1]
    files = sorted(directory.glob("*.safetensors"))
    if len(files) != 1:
        raise CheckpointError(
            f"{directory}: expected one *.safetensors file or an *.safetensors.index.json, "
            f"found {[f.name for f in files]}"
        )
    return {key: files[0].name for key in read_header(files[0])}


def index_shards(directory: Path) -> tuple[Path, dict[str, str]] | None:
    """The transformer's ``*.safetensors.index.json`` and its ``weight_map`` (stored key -> shard path relative to
    ``directory``, a subfolder allowed); None when it has no index.

    Raises CheckpointError: several indexes, no weight_map, a shard outside ``directory`` (``..``, an absolute path)
    or not there.
    """
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise CheckpointError(f"{directory}: several index files {[i.name for i in indexes]}; keep one")
    if not indexes:
        return None
    index = read_json(indexes[0], "missing")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{indexes[0]}: no 'weight_map' object of tensor name -> shard file")
    outside = sorted({str(f) for f in map(PurePosixPath, weight_map.values()) if f.is_absolute() or ".." in f.parts})
    if outside:
        raise CheckpointError(f"{indexes[0]}: shard files outside {directory.name}/: {outside}; a checkpoint's shards "
                              f"lie in its {directory.name}/ folder (re-export it)")
    missing = sorted({f for f in weight_map.values() if not (directory / f).is_file()})
    if missing:
        raise CheckpointError(f"{indexes[0]}: shard files listed but not present: {missing}")
    return indexes[0], weight_map


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """Key -> (dtype tag, shape, offset of its data in the file) from a safetensors header, after checking it
    describes the whole file.

    Layout: 8-byte little-endian header length N, N bytes of JSON, then the tensor data; every
    tensor's ``data_offsets`` lie in the data, and the last one ends where the file ends.
    """
    try:
        f = open_file(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header (truncated)")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(_HEADER_LIMIT, size - 8):
            raise CheckpointError(f"{path}: header claims {length} bytes but the file has {size}; "
                                  "not a safetensors file, or truncated")
        raw = f.read(length)
    try:
        header = json_text.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: the safetensors header is not JSON (garbage or overwritten file)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    data = size - 8 - length
    out, end = {}, 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        dtype, shape, offsets = _entry(path, key, entry)
        if offsets[1] - offsets[0] != math.prod(shape) * _ITEM_SIZE[dtype] or offsets[0] > offsets[1]:
            raise CheckpointError(f"{path}: {key}: data_offsets {offsets} do not hold a {dtype} tensor of shape "
                                  f"{list(shape)} (corrupt header)")
        end = max(end, offsets[1])
        out[key] = (dtype, shape, 8 + length + offsets[0])
    if end != data:
        state = "truncated" if end > data else "has trailing bytes"
        raise CheckpointError(f"{path}: the header's tensors need {end} data bytes but the file holds {data} ({state}; "
                              "re-download or re-export it)")
    return out


def _entry(path: Path, key: str, entry: object) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    ok = (
        isinstance(entry, dict)
        and entry.get("dtype") in _ITEM_SIZE
        and isinstance(entry.get("shape"), list)
        and all(is_int(d) and d >= 0 for d in entry["shape"])
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and all(is_int(o) and o >= 0 for o in entry["data_offsets"])
    )
    if not ok:
        raise CheckpointError(f"{path}: header entry {key!r} is not {{dtype, shape, data_offsets}}: {entry!r}")
    return entry["dtype"], tuple(entry["shape"]), tuple(entry["data_offsets"])


# ---------------------------------------------------------------------------------- FP8 layout


def linear_sites(config: Cosmos3Config) -> set[str]:
    """Every module the model builds as a ``Linear``: the ones that can run W8A8 (checkpoint names)."""
    attention = ("to_q", "to_k", "to_v", "to_out", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
    sites = {"proj_in", "proj_out", "time_embedder.linear_1", "time_embedder.linear_2"}
    if config.sound_gen:
        sites |= {"audio_proj_in", "audio_proj_out"}
    for i in range(config.num_hidden_layers):
        sites |= {f"layers.{i}.self_attn.{name}" for name in attention}
        sites |= {f"layers.{i}.{mlp}.{p}_proj" for mlp in ("mlp", "mlp_moe_gen") for p in ("gate", "up", "down")}
    return sites


def fp8_modules(config: Cosmos3Config, tensors: dict[str, TensorHeader], where: Path | str) -> frozenset[str]:
    """The modules whose checkpoint weights are FP8, after checking we can run each one exactly.

    Refused, every problem listed at once: FP8 without a ModelOpt static-FP8 quantization_config;
    FP8 on a module we have no W8A8 method for; a quantized module the ignore list names; a missing,
    non-fp32 or non-per-tensor (block / channel) scale; a scale on a high-precision module; and,
    under static FP8, a projection neither quantized nor ignored.
    """
    quant = config.quantization
    static = uses_static_fp8(quant)
    if static:  # the ignore list may name modules in the legacy dialect (vae2llm, model.layers...), as sglang maps
        quant = dataclasses.replace(quant, ignore=tuple(dict.fromkeys(quant.ignore + tuple(map(normalize_key,
                                                                                                 quant.ignore)))))
    quantized = {key.removesuffix(".weight") for key, t in tensors.items()
                 if key.endswith(".weight") and t.dtype == FP8_DTYPE}
    sites = linear_sites(config)
    problems: list[str] = []
    if quantized and not static:
        problems.append(f"{len(quantized)} module(s) hold FP8 weights (e.g. {min(quantized)}) but config.json's "
                        f"quantization_config is {_describe(quant)}; only ModelOpt static per-tensor FP8 "
                        "(quant_method 'modelopt', quant_algo 'FP8', static input_activations) is supported")
    for module in sorted(quantized):
        if module not in sites:
            problems.append(f"{module}: FP8 weight on a module with no W8A8 method here (only the decoder "
                            "projections, proj_in, proj_out, time_embedder.linear_1/2 and the audio projections "
                            "run FP8); export it high precision (add it to the exclusions)")
            continue
        if static and quant.is_ignored(module):
            problems.append(f"{module}: quantized (FP8 weight) but quantization_config.ignore lists it; the "
                            "checkpoint contradicts its config (re-export it)")
        problems += _scale_problems(module, tensors)
    for key in sorted(tensors):
        module, _, suffix = key.rpartition(".")
        if suffix in SCALES and module not in quantized:
            weight = tensors.get(f"{module}.weight")
            problems.append(f"{key}: a static FP8 scale for {module}, whose weight is "
                            f"{weight.dtype if weight else 'absent'}; static scales belong to FP8 weights only")
    if static and not quantized:
        problems.append("config.json declares ModelOpt static FP8 but no weight is FP8 (an unquantized checkpoint "
                        "with a quantized config): drop quantization_config, or export the model with "
                        "python -m cosmos3.checkpoint.fp8_export")
    elif static:
        for module in sorted(sites - quantized):
            weight = tensors.get(f"{module}.weight")
            if weight is not None and not quant.is_ignored(module):
                problems.append(f"{module}.weight is {weight.dtype}, but quantization_config declares ModelOpt "
                                f"static FP8 and does not list {module} in 'ignore' (re-export, or drop "
                                "quantization_config to run this checkpoint unquantized)")
    if problems:
        raise CheckpointError(f"{where}: {len(problems)} quantization problem(s):\n  " + "\n  ".join(problems))
    return frozenset(quantized)


def _scale_problems(module: str, tensors: dict[str, TensorHeader]) -> list[str]:
    problems = []
    for suffix in SCALES:
        scale = tensors.get(f"{module}.{suffix}")
        if scale is None:
            problems.append(f"{module}.{suffix} is missing: a static W8A8 layer needs a per-tensor weight_scale and "
                            "input_scale (re-export with ModelOpt's FP8 per-tensor config and max calibration)")
        elif scale.dtype != "F32":
            problems.append(f"{module}.{suffix} is {scale.dtype}; ModelOpt writes float32 scales")
        elif math.prod(scale.shape) != 1:
            problems.append(f"{module}.{suffix} has shape {list(scale.shape)}: block-wise or per-channel scales are "
                            "not supported, only per-tensor ones (0-d or one element)")
    return problems


def _describe(quant: QuantConfig | None) -> str:
    if quant is None:
        return "absent"
    return (f"quant_method={quant.quant_method!r} quant_algo={quant.quant_algo!r} "
            f"static inputs={quant.static_input} weight_only={quant.weight_only}")
