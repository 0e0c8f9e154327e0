"""Read a Cosmos3 transformer checkpoint (sharded safetensors + index) into our model, strictly.

* What the files hold (keys, dtypes, shapes, offsets, which modules are FP8) comes from
  ``checkpoint_header``, the torch-free reader ``farm validate`` also runs; this module fills the
  model, with the tensor data read by ``tensor_reader`` ahead of it, in the order it fills.
* Two key dialects: the diffusers flat layout (``layers.0.self_attn.to_q.weight``) and the
  legacy ``model.``-prefixed one (``model.layers.0.self_attn.q_proj.weight``, ``*_moe_gen``,
  ``vae2llm``...); ``normalize_key`` maps the second onto the first, in the open.
* Strict: every checkpoint tensor lands somewhere or is in ``SKIPPED``; every model tensor is
  found; all mismatches are reported together.
* ModelOpt buffers (``*_quantizer._amax/_scale``), where an exporter wrote them, are checked
  against the scales they duplicate (quant/fp8_static.py) and then dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from cosmos3.checkpoint.tensor_reader import PlannedRead, Stored, read_tensor
from cosmos3.errors import CheckpointError
from cosmos3.layers.linear import Linear
from cosmos3.quant.fp8_static import MODELOPT_BUFFERS
from cosmos3.rules.checkpoint_header import SKIPPED, TensorHeader, normalize_key, read_tensors

__all__ = ["SKIPPED", "CheckpointFiles", "TensorDict", "load_checkpoint", "normalize_key"]

# safetensors dtype tags of the tensors a Cosmos3 checkpoint holds.
_DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_TAGS = {dtype: tag for tag, dtype in _DTYPES.items()}


class CheckpointFiles:
    """The tensors of one ``transformer/`` directory, by flat key, read from their shard on ``get``
    (cosmos3/checkpoint/tensor_reader.py); after ``plan(keys)``, read ahead in that order by threads."""

    def __init__(self, directory: str | Path, device: str | torch.device = "cpu",
                 headers: dict[str, TensorHeader] | None = None):
        self.directory = Path(directory)
        self.device = torch.device(device)
        self.headers = read_tensors(self.directory) if headers is None else headers
        self._planned: PlannedRead | None = None
        self.bytes_read = 0  # by get(): what loading moved from disk to the device

    def keys(self) -> set[str]:
        return set(self.headers)

    def __contains__(self, key: str) -> bool:
        return key in self.headers

    def plan(self, keys: list[str]) -> None:
        """The keys ``get`` will ask for next, in order: they are read ahead, in parallel."""
        self.close()
        self._planned = PlannedRead([self._stored(key) for key in keys], self.device)

    def get(self, key: str) -> torch.Tensor:
        if self._planned is not None and self._planned.holds(key):
            tensor = self._planned.take(key)
        else:
            tensor = read_tensor(self._stored(key), self.device)
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        """Stops a plan's reading (its threads, its pinned buffers); loading closes it when it ends."""
        if self._planned is not None:
            self._planned.close()
        self._planned = None

    def _stored(self, key: str) -> Stored:
        header = self.headers[key]
        return Stored(key, header.file, header.offset, _DTYPES[header.dtype], header.shape)

    def shape_of(self, key: str) -> tuple[int, ...]:
        return self.headers[key].shape


class TensorDict:
    """In-memory tensors behind the same interface as CheckpointFiles (benchmarks, conversions)."""

    def __init__(self, tensors: dict[str, torch.Tensor], directory: str = "<memory>"):
        self._tensors = {normalize_key(k): v for k, v in tensors.items()}
        self.directory = directory
        self.headers = {k: TensorHeader(k, None, _TAGS[v.dtype], tuple(v.shape)) for k, v in self._tensors.items()}
        self.bytes_read = 0  # nothing is read: the tensors are already in memory

    def keys(self) -> set[str]:
        return set(self._tensors)

    def __contains__(self, key: str) -> bool:
        return key in self._tensors

    def plan(self, keys: list[str]) -> None:
        """Nothing to read ahead: the tensors are in memory."""

    def get(self, key: str) -> torch.Tensor:
        return self._tensors[key]

    def close(self) -> None:
        """Nothing reads: nothing to stop."""

    def shape_of(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensors[key].shape)


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
            if _is_static(linear):  # ModelOpt's duplicates of the scales: checked at load, then dropped
                consumed.update(f"{prefix}.{b}" for b in MODELOPT_BUFFERS if f"{prefix}.{b}" in files)
            problems += _shape_problems(linear, shard, prefix, files)

    unknown = sorted(files.keys() - consumed - SKIPPED.keys())
    problems += [f"unexpected: {key}" for key in unknown]
    if problems:
        raise CheckpointError(
            f"{files.directory}: {len(problems)} checkpoint problem(s):\n  " + "\n  ".join(problems)
        )

    # What is read, in the order it is read: the files read ahead in this order.
    sources = {name: dict(_linear_keys(linear, name, files)) for name, linear in linears.items()}
    files.plan([*plain, *(key for shards in sources.values() for keys in shards.values() for key in keys.values())])
    try:
        for name, tensor in plain.items():  # state_dict() tensors share the parameters' storage
            tensor.copy_(files.get(name).to(tensor.dtype))
        for name, linear in linears.items():
            shards = {shard: {suffix: files.get(key) for suffix, key in keys.items()}
                      for shard, keys in sources[name].items()}
            linear.quant_method.load_weights(linear, shards, name)
            linear.quant_method.process_weights_after_loading(linear)
    finally:
        files.close()


def _linear_keys(linear: Linear, name: str, files) -> Iterator[tuple[str, dict[str, str]]]:
    """(shard, {tensor suffix: checkpoint key}) of each projection ``linear`` loads, ModelOpt's buffers included."""
    wanted = linear.quant_method.checkpoint_tensors(linear)
    if _is_static(linear):
        wanted += tuple(MODELOPT_BUFFERS)
    for shard, prefix in _linear_sources(name, linear):
        yield shard, {suffix: f"{prefix}.{suffix}" for suffix in wanted if f"{prefix}.{suffix}" in files}


def _shape_problems(linear: Linear, shard: str, prefix: str, files: CheckpointFiles | TensorDict) -> list[str]:
    width = linear.shard_sizes[linear.shard_keys.index(shard)]
    wanted = {"weight": (width, linear.in_features), "bias": (width,) if linear.has_bias else None}
    return [
        f"shape: {prefix}.{suffix} is {files.shape_of(f'{prefix}.{suffix}')} in the checkpoint, the model needs {shape}"
        for suffix, shape in wanted.items()
        if shape is not None and f"{prefix}.{suffix}" in files and files.shape_of(f"{prefix}.{suffix}") != shape
    ]


def _is_static(linear: Linear) -> bool:
    return "input_scale" in linear.quant_method.checkpoint_tensors(linear)
