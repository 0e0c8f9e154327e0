"""Write transformer checkpoints the way published ones are laid out: sharded safetensors + index."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from safetensors.torch import save_file

# The legacy (cosmos-framework, `model.`-prefixed) names of flat-layout attention components.
LEGACY_ATTENTION = {
    "to_q": "q_proj", "to_k": "k_proj", "to_v": "v_proj", "to_out": "o_proj",
    "add_q_proj": "q_proj_moe_gen", "add_k_proj": "k_proj_moe_gen", "add_v_proj": "v_proj_moe_gen",
    "to_add_out": "o_proj_moe_gen", "norm_q": "q_norm", "norm_k": "k_norm",
    "norm_added_q": "q_norm_moe_gen", "norm_added_k": "k_norm_moe_gen",
}


def legacy_key(key: str) -> str:
    """``layers.0.self_attn.to_q.weight`` -> ``model.layers.0.self_attn.q_proj.weight`` etc."""
    parts = key.split(".")
    if parts[0] == "layers" and parts[2] == "self_attn":
        parts[3] = LEGACY_ATTENTION[parts[3]]
    top = {"proj_in": "vae2llm", "proj_out": "llm2vae"}
    parts[0] = top.get(parts[0], parts[0])
    if parts[0] == "time_embedder":
        parts[1] = {"linear_1": "mlp.0", "linear_2": "mlp.2"}[parts[1]]
    if parts[0] in ("layers", "embed_tokens", "norm", "norm_moe_gen"):
        parts.insert(0, "model")
    return ".".join(parts)


def write_sharded(tensors: dict[str, torch.Tensor], directory: Path, *, num_shards: int, seed: int = 0,
                  config: dict | None = None) -> Path:
    """Scatter ``tensors`` over shards at random (a weight and its scales may part ways) + index."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    names = [f"diffusion_pytorch_model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    shards: dict[str, dict[str, torch.Tensor]] = {n: {} for n in names}
    weight_map = {}
    for key, tensor in tensors.items():
        shard = rng.choice(names)
        shards[shard][key] = tensor.contiguous()
        weight_map[key] = shard
    for shard, content in shards.items():
        save_file(content, directory / shard)
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory
