"""Checkpoint layouts and strictness: legacy keys, sharding, unknown and missing tensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from cosmos3 import load_transformer
from cosmos3.checkpoint.weights import SKIPPED
from cosmos3.errors import CheckpointError, ConfigError
from testbed.reference import tiny_reference
from tests.cosmos3.checkpoint_files import legacy_key, write_sharded


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """A diffusers save_pretrained checkpoint: its tensors and config."""
    path = tmp_path_factory.mktemp("flat")
    tiny_reference().save_pretrained(path, safe_serialization=True)
    tensors = load_file(path / "diffusion_pytorch_model.safetensors")
    return path, tensors, json.loads((path / "config.json").read_text())


def velocity(path):
    model = load_transformer(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    return model.velocity(torch.tensor([3, 1, 4]), torch.randn(4, 2, 4, 4, generator=g), 500.0, fps=24.0)


def test_published_skip_set_is_in_the_reference_checkpoint(flat):
    _, tensors, _ = flat
    assert set(SKIPPED) <= set(tensors)


def test_legacy_layout_loads_to_identical_outputs(flat, tmp_path):
    path, tensors, config = flat
    legacy = {legacy_key(k): v for k, v in tensors.items()}
    assert "model.layers.0.self_attn.q_proj_moe_gen.weight" in legacy and "vae2llm.weight" in legacy
    write_sharded(legacy, tmp_path / "legacy", num_shards=3, config=config)
    assert torch.equal(velocity(tmp_path / "legacy"), velocity(path))


def test_sharded_checkpoint_with_tensors_in_unexpected_shards_loads(flat, tmp_path):
    path, tensors, config = flat
    out = write_sharded(tensors, tmp_path / "sharded", num_shards=4, seed=7, config=config)
    index = json.loads((out / "diffusion_pytorch_model.safetensors.index.json").read_text())["weight_map"]
    # Q of layer 0's GEN tower lives in a different shard than its K: nothing may assume locality.
    assert len({index[f"layers.0.self_attn.add_{x}_proj.weight"] for x in "qkv"}) > 1
    assert torch.equal(velocity(out), velocity(path))


def test_unknown_and_missing_keys_are_listed_by_name(flat, tmp_path):
    _, tensors, config = flat
    broken = dict(tensors)
    del broken["layers.1.mlp_moe_gen.down_proj.weight"]
    del broken["norm_moe_gen.weight"]
    broken["layers.0.self_attn.mystery.weight"] = torch.zeros(2)
    write_sharded(broken, tmp_path / "broken", num_shards=2, config=config)
    with pytest.raises(CheckpointError) as err:
        load_transformer(tmp_path / "broken")
    message = str(err.value)
    assert "3 checkpoint problem(s)" in message
    assert "missing: layers.1.mlp_moe_gen.down_proj.weight" in message
    assert "missing: norm_moe_gen.weight" in message
    assert "unexpected: layers.0.self_attn.mystery.weight" in message


def test_shape_mismatch_names_tensor_and_both_shapes(flat, tmp_path):
    _, tensors, config = flat
    broken = dict(tensors)
    broken["layers.0.self_attn.to_k.weight"] = torch.zeros(16, 64)
    write_sharded(broken, tmp_path / "shape", num_shards=1, config=config)
    with pytest.raises(CheckpointError, match=r"layers.0.self_attn.to_k.weight is \(16, 64\).*needs \(32, 64\)"):
        load_transformer(tmp_path / "shape")


@pytest.mark.parametrize("field,value,message", [
    pytest.param("hidden_act", "relu2", "Edge relu2", id="edge-backbone"),
    pytest.param("joint_attn_implementation", "one_way", "only 'two_way'", id="joint-attn"),
    pytest.param("position_embedding_type", "rope", "only 'unified_3d_mrope'", id="position-embedding"),
])
def test_unsupported_config_values_are_refused(flat, tmp_path, field, value, message):
    path, _, config = flat
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    (tmp_path / "diffusion_pytorch_model.safetensors").symlink_to(path / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ConfigError, match=message):
        load_transformer(tmp_path)
