"""BF16 checkpoint in, ModelOpt-layout static FP8 checkpoint out (for tests, benchmarks and the demo).

Input scales are calibrated by max over real forward passes: ``calibrate(model)`` runs the
BF16 model however the caller likes (denoising trajectories, usually) while hooks record the
largest ``|x|`` each decoder projection sees. Projections that read one activation (Q/K/V of a
tower, gate/up) see the same tensor, so they get the same input_scale, as ModelOpt's do.
Layout (reference §5.2-§5.5): per projection ``weight`` (e4m3, ``[out, in]``), ``weight_scale``
and ``input_scale`` (fp32 scalars) and the ModelOpt buffers; everything else as it was.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from cosmos3 import ops
from cosmos3.checkpoint import CheckpointFiles, TensorDict
from cosmos3.layers.linear import Linear
from cosmos3.loader import load_transformer, transformer_dir
from cosmos3.quant.fp8_static import FP8_MAX
from cosmos3.transformer import Cosmos3Transformer

# ModelOpt's non-quantized modules, as its exporter writes them (reference §5.3).
MODULES_TO_NOT_CONVERT = ["proj_in", "proj_out", "time_embedder", "audio_proj_in", "audio_proj_out",
                          "action_proj_in", "action_proj_out", "lm_head", "visual"]
IGNORE = ["proj_in", "proj_out", "time_embedder*", "audio_proj_in", "audio_proj_out", "action_proj_in",
          "action_proj_out", "lm_head", "model.visual*", "visual*"]

PUBLISHED_STEP_POLICY = {
    "schema_version": 1, "type": "first_last_n", "index_space": "denoising_loop_iteration",
    "scope": ["transformer"], "default_mode": "native",
    "first_steps": {"count": 3, "mode": "a16"}, "last_steps": {"count": 3, "mode": "a16"},
    "overlap": "a16", "reasoner": "a16",
}


def quantization_config(*, ignore: list[str], step_policy: dict | None) -> dict:
    """The ``quantization_config`` keys ModelOpt's Cosmos3 exporter writes."""
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    config = {
        "quant_method": "modelopt", "quant_algo": "FP8", "quant_type": "FP8_FP8", "weight_only": False,
        "config_groups": {"group_0": {"weights": fp8, "input_activations": dict(fp8), "targets": ["Linear"]}},
        "calib_cfg": {"method": "max"}, "producer": {"name": "cosmos3-farm", "version": "0.1.0"},
        "ignore": IGNORE + [i for i in ignore if i not in IGNORE],
        "modules_to_not_convert": MODULES_TO_NOT_CONVERT,
        "block_quantize": None, "channel_quantize": None, "scale_block_quantize": None,
        "scale_channel_quantize": None, "disable_conv_quantization": False, "forward_loop": None,
    }
    if step_policy is not None:
        config["runtime"] = {"diffusion_step_policy": step_policy}
    return config


def calibrate_input_amax(model: Cosmos3Transformer, calibrate: Callable[[Cosmos3Transformer], None]) -> dict[str, float]:
    """Checkpoint projection name -> max |input| over everything ``calibrate`` runs."""
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for name, linear in model.named_modules():
        if isinstance(linear, Linear):
            def record(module, args, name=name):
                seen = args[0].detach().abs().amax().float()
                amax[name] = torch.maximum(amax[name], seen) if name in amax else seen
            hooks.append(linear.register_forward_pre_hook(record))
    model.skip_unread_und_mlp = False
    try:
        calibrate(model)
    finally:
        model.skip_unread_und_mlp = True
        for hook in hooks:
            hook.remove()
    # A fused Linear's input is every shard's input: fan its amax out to the shard names.
    per_projection = {}
    for name, value in amax.items():
        linear = model.get_submodule(name)
        parent = name.rsplit(".", 1)[0]
        for shard in linear.shard_keys:
            per_projection[f"{parent}.{shard}" if shard else name] = value.item()
    return per_projection


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor ``weight_scale = max|W| / 448`` and the e4m3 weight (saturating, round to nearest even)."""
    w = weight.float().contiguous()
    scale = (w.abs().amax() / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return ops.quantize_fp8(w, scale.reshape(1)), scale


def export_static_fp8(
    src: str | Path,
    dst: str | Path,
    calibrate: Callable[[Cosmos3Transformer], None],
    *,
    step_policy: dict | None = None,
    ignore: list[str] = (),
    num_shards: int = 2,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write ``dst`` (a checkpoint root, or a transformer dir if ``src`` is one) from BF16 ``src``."""
    src_dir, src_root = transformer_dir(src), Path(src)
    dst_root = Path(dst)
    dst_dir = dst_root / "transformer" if src_dir != src_root else dst_root
    model = load_transformer(src_dir, dtype=dtype, precision="bf16")
    amax = calibrate_input_amax(model, calibrate)
    config = json.loads((src_dir / "config.json").read_text())
    quant = quantization_config(ignore=list(ignore), step_policy=step_policy)
    tensors = quantize_tensors(CheckpointFiles(src_dir), amax, quant)

    if src_dir != src_root:  # copy the other components unchanged
        shutil.copytree(src_root, dst_root, ignore=shutil.ignore_patterns("transformer"), dirs_exist_ok=True)
        hf_quant = {k: v for k, v in quant.items() if k != "runtime"}
        (dst_root / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2))
    _write_shards(tensors, dst_dir, num_shards)
    (dst_dir / "config.json").write_text(json.dumps({**config, "quantization_config": quant}, indent=2))
    return dst_root


def quantize_tensors(files: CheckpointFiles | TensorDict, amax: dict[str, float], quant: dict) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor, decoder projections (not ignored, calibrated) turned static FP8."""
    from cosmos3.config import QuantConfig

    rules = QuantConfig.from_dict(quant)
    out: dict[str, torch.Tensor] = {}
    for key in sorted(files.keys()):
        module, _, suffix = key.rpartition(".")
        tensor = files.get(key)
        if module not in amax or suffix != "weight" or rules.is_ignored(module):
            out[key] = tensor
            continue
        weight, weight_scale = quantize_weight(tensor)
        input_scale = torch.tensor(max(amax[module], torch.finfo(torch.float32).tiny) / FP8_MAX, dtype=torch.float32)
        out[f"{module}.weight"] = weight
        out[f"{module}.weight_scale"] = weight_scale.reshape(())
        out[f"{module}.input_scale"] = input_scale
        out[f"{module}.weight_quantizer._amax"] = weight_scale.reshape(()) * FP8_MAX
        out[f"{module}.weight_quantizer._scale"] = weight_scale.reshape(()).clone()
        out[f"{module}.input_quantizer._amax"] = input_scale * FP8_MAX
    return out


def _write_shards(tensors: dict[str, torch.Tensor], directory: Path, num_shards: int) -> None:
    """Round-robin over shards so a projection's weight and scales usually land in different files."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors*"):
        old.unlink()
    names = [f"diffusion_pytorch_model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    shards: list[dict[str, torch.Tensor]] = [{} for _ in names]
    weight_map = {}
    for i, (key, tensor) in enumerate(tensors.items()):
        shards[i % num_shards][key] = tensor.contiguous()
        weight_map[key] = names[i % num_shards]
    for name, content in zip(names, shards):
        save_file(content, directory / name, metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    (directory / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index, indent=2))
