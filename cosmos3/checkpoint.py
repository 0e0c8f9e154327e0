"""Read a Cosmos3 transformer checkpoint (sharded safetensors + index) into our model, strictly.

* Any tensor may live in any shard: the index's ``weight_map`` is followed, never guessed.
* Two key dialects: the diffusers flat layout (``layers.0.self_attn.to_q.weight``) and the
  legacy ``model.``-prefixed one (``model.layers.0.self_attn.q_proj.weight``, ``*_moe_gen``,
  ``vae2llm``...); ``normalize_key`` maps the second onto the first, in the open.
* Strict: every checkpoint tensor lands somewhere or is in ``SKIPPED``; every model tensor is
  found; all mismatches are reported together.
* ModelOpt buffers (``*_quantizer._amax/_scale``) are checked against the scales they duplicate
  (quant/fp8_static.py) and then dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from cosmos3.errors import CheckpointError
from cosmos3.layers.linear import Linear
from cosmos3.quant.fp8_static import FP8, MODELOPT_BUFFERS

# Present in published checkpoints, deliberately not loaded (generation never reads them).
SKIPPED = {
    "lm_head.weight": "the UND tower's LM head: generation never decodes text",
    "norm.weight": "the UND tower's final norm: predictions are read from GEN outputs only",
}

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


class CheckpointFiles:
    """The tensors of one ``transformer/`` directory, by flat key, read lazily from their shard."""

    def __init__(self, directory: str | Path, device: str | torch.device = "cpu"):
        self.directory = Path(directory)
        self.device = str(device)
        self._where: dict[str, tuple[Path, str]] = {}  # flat key -> (shard file, key as stored)
        for raw_key, shard in self._weight_map().items():
            key = normalize_key(raw_key)
            if key in self._where:
                raise CheckpointError(f"{self.directory}: {raw_key!r} and {self._where[key][1]!r} both map to {key!r}")
            self._where[key] = (self.directory / shard, raw_key)
        self._handles: dict[Path, object] = {}

    def _weight_map(self) -> dict[str, str]:
        indexes = sorted(self.directory.glob("*.safetensors.index.json"))
        if len(indexes) > 1:
            raise CheckpointError(f"{self.directory}: several index files {[i.name for i in indexes]}; keep one")
        if indexes:
            weight_map = json.loads(indexes[0].read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{indexes[0]}: no 'weight_map' object")
            missing = sorted({f for f in weight_map.values() if not (self.directory / f).is_file()})
            if missing:
                raise CheckpointError(f"{indexes[0]}: shard files listed but not present: {missing}")
            return weight_map
        files = sorted(self.directory.glob("*.safetensors"))
        if len(files) != 1:
            raise CheckpointError(
                f"{self.directory}: expected one *.safetensors file or an *.safetensors.index.json, found "
                f"{[f.name for f in files]}"
            )
        with safe_open(files[0], framework="pt") as f:
            return {key: files[0].name for key in f.keys()}

    def keys(self) -> set[str]:
        return set(self._where)

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def _handle(self, key: str):
        """(open shard, key as stored); each shard's header is parsed once, on first use."""
        path, raw_key = self._where[key]
        if path not in self._handles:
            self._handles[path] = safe_open(path, framework="pt", device=self.device)
        return self._handles[path], raw_key

    def _slice(self, key: str):
        handle, raw_key = self._handle(key)
        return handle.get_slice(raw_key)

    def get(self, key: str) -> torch.Tensor:
        handle, raw_key = self._handle(key)
        return handle.get_tensor(raw_key)

    def dtype_of(self, key: str) -> torch.dtype:
        return _DTYPES[self._slice(key).get_dtype()]

    def shape_of(self, key: str) -> tuple[int, ...]:
        return tuple(self._slice(key).get_shape())


class TensorDict:
    """In-memory tensors behind the same interface as CheckpointFiles (benchmarks, conversions)."""

    def __init__(self, tensors: dict[str, torch.Tensor], directory: str = "<memory>"):
        self._tensors = {normalize_key(k): v for k, v in tensors.items()}
        self.directory = directory

    def keys(self) -> set[str]:
        return set(self._tensors)

    def __contains__(self, key: str) -> bool:
        return key in self._tensors

    def get(self, key: str) -> torch.Tensor:
        return self._tensors[key]

    def dtype_of(self, key: str) -> torch.dtype:
        return self._tensors[key].dtype

    def shape_of(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensors[key].shape)


# safetensors dtype tags of the tensors a Cosmos3 checkpoint holds.
_DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def _linear_sources(name: str, linear: Linear) -> Iterator[tuple[str, str]]:
    """(shard key, checkpoint prefix) of each projection a Linear loads from."""
    parent = name.rsplit(".", 1)[0]
    for shard in linear.shard_keys:
        yield shard, (f"{parent}.{shard}" if shard else name)


def load_checkpoint(model: torch.nn.Module, files: CheckpointFiles | TensorDict) -> None:
    """Fill every parameter of ``model`` from ``files``; raise one CheckpointError listing every problem."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    plain = {
        name: tensor for name, tensor in model.state_dict().items()
        if name.rsplit(".", 1)[0] not in linears
    }
    problems: list[str] = []
    consumed: set[str] = set()
    _check_static_destinations(linears, files)

    for name, tensor in plain.items():
        if name not in files:
            problems.append(f"missing: {name}")
        elif files.shape_of(name) != tuple(tensor.shape):
            problems.append(f"shape: {name} is {files.shape_of(name)} in the checkpoint, the model needs "
                            f"{tuple(tensor.shape)}")
        consumed.add(name)
    for name, linear in linears.items():
        for shard, prefix in _linear_sources(name, linear):
            for suffix in linear.quant_method.checkpoint_tensors(linear):
                key = f"{prefix}.{suffix}"
                consumed.add(key)
                if key not in files:
                    problems.append(f"missing: {key}")
            consumed.update(f"{prefix}.{b}" for b in MODELOPT_BUFFERS if f"{prefix}.{b}" in files)
            problems += _weight_shape_problem(linear, shard, prefix, files)

    unknown = sorted(files.keys() - consumed - SKIPPED.keys())
    problems += [_describe_unknown(key, linears) for key in unknown]
    if problems:
        raise CheckpointError(
            f"{files.directory}: {len(problems)} checkpoint problem(s):\n  " + "\n  ".join(problems)
        )

    for name, tensor in plain.items():  # state_dict() tensors share the parameters' storage
        tensor.copy_(files.get(name).to(tensor.dtype))
    for name, linear in linears.items():
        shards = {}
        for shard, prefix in _linear_sources(name, linear):
            wanted = linear.quant_method.checkpoint_tensors(linear) + tuple(MODELOPT_BUFFERS)
            shards[shard] = {s: files.get(f"{prefix}.{s}") for s in wanted if f"{prefix}.{s}" in files}
        linear.quant_method.load_weights(linear, shards, name)
        linear.quant_method.process_weights_after_loading(linear)


def _weight_shape_problem(linear: Linear, shard: str, prefix: str, files: CheckpointFiles) -> list[str]:
    key = f"{prefix}.weight"
    if key not in files:
        return []
    width = linear.shard_sizes[linear.shard_keys.index(shard)]
    if files.shape_of(key) != (width, linear.in_features):
        return [f"shape: {key} is {files.shape_of(key)} in the checkpoint, the model needs ({width}, "
                f"{linear.in_features})"]
    return []


def _check_static_destinations(linears: dict[str, Linear], files: CheckpointFiles) -> None:
    """A static FP8 recipe needs FP8 weights: refuse an unquantized checkpoint up front, by name."""
    for name, linear in linears.items():
        if not linear.quant_method.shares_input_quant:
            continue
        key = f"{name}.weight"
        dtype = files.dtype_of(key) if key in files else FP8
        if dtype != FP8:
            raise CheckpointError(
                f"{files.directory}: config.json declares ModelOpt static FP8 but {key} is {dtype}; "
                "a static recipe cannot run an unquantized checkpoint (drop quantization_config, or export the "
                "model with cosmos3.fp8_export.export_static_fp8)"
            )


def _describe_unknown(key: str, linears: dict[str, Linear]) -> str:
    prefix, _, suffix = key.rpartition(".")
    scale_like = suffix in ("weight_scale", "input_scale") or "_quantizer" in prefix
    module = prefix.split(".weight_quantizer")[0].split(".input_quantizer")[0]
    if scale_like and module in linears:
        return (f"unexpected: {key}: a static FP8 scale for {module}, which is built high precision (it is on the "
                "ignore list, or precision was forced); static scales only land in FP8 destinations")
    return f"unexpected: {key}"
