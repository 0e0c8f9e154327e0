"""The torch-free header reader: damage a header shows is refused, by file and field, at inspect and at load alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from cosmos3 import load_transformer
from cosmos3.errors import CheckpointError, ConfigError
from cosmos3.rules.checkpoint_header import inspect
from testbed.reference import tiny_reference
from tests.cosmos3.checkpoint_files import write_sharded

INDEX = "diffusion_pytorch_model.safetensors.index.json"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A tiny BF16 transformer dir in three shards + index."""
    single = tmp_path_factory.mktemp("single")
    tiny_reference().save_pretrained(single, safe_serialization=True)
    config = json.loads((single / "config.json").read_text())
    tensors = load_file(single / "diffusion_pytorch_model.safetensors")
    return write_sharded(tensors, tmp_path_factory.mktemp("sharded") / "transformer", num_shards=3, config=config)


def copy_of(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def first_shard(directory: Path) -> Path:
    return sorted(directory.glob("*-of-*.safetensors"))[0]


def truncate(d: Path) -> Path:
    shard = first_shard(d)
    os.truncate(shard, shard.stat().st_size - 100)
    return shard


def garbage_header(d: Path) -> Path:
    shard = first_shard(d)
    data = bytearray(shard.read_bytes())
    data[8:40] = b"\xff\xfe not json at all, sorry \x00\x01\x02"
    shard.write_bytes(bytes(data))
    return shard


def huge_length(d: Path) -> Path:
    shard = first_shard(d)
    data = bytearray(shard.read_bytes())
    data[0:8] = (10**9).to_bytes(8, "little")
    shard.write_bytes(bytes(data))
    return shard


def trailing_bytes(d: Path) -> Path:
    shard = first_shard(d)
    with shard.open("ab") as f:
        f.write(b"\0" * 64)
    return shard


def missing_shard(d: Path) -> Path:
    first_shard(d).unlink()
    return d / INDEX


def index_names_a_tensor_the_shard_lacks(d: Path) -> Path:
    index = json.loads((d / INDEX).read_text())
    index["weight_map"]["layers.0.mlp.extra.weight"] = first_shard(d).name
    (d / INDEX).write_text(json.dumps(index))
    return first_shard(d)


def config_edit(**fields):
    def edit(d: Path) -> Path:
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**config, **fields}))
        return d / "config.json"
    return edit


DAMAGE = [
    pytest.param(truncate, CheckpointError, r"need \d+ data bytes but the file holds \d+ \(truncated", id="truncated"),
    pytest.param(garbage_header, CheckpointError, "the safetensors header is not JSON", id="garbage-header"),
    pytest.param(huge_length, CheckpointError, r"header claims 1000000000 bytes but the file has \d+",
                 id="huge-length"),
    pytest.param(trailing_bytes, CheckpointError, "has trailing bytes", id="trailing-bytes"),
    pytest.param(missing_shard, CheckpointError, "shard files listed but not present", id="missing-shard"),
    pytest.param(index_names_a_tensor_the_shard_lacks, CheckpointError,
                 r"the index maps 'layers.0.mlp.extra.weight' to this shard, whose header has no such tensor",
                 id="index-shard-mismatch"),
    pytest.param(config_edit(hidden_size="192"), ConfigError, r"hidden_size must be an integer, got '192' \(str\)",
                 id="hidden-size-string"),
    pytest.param(config_edit(rms_norm_eps="1e-6"), ConfigError, "rms_norm_eps must be a number", id="eps-string"),
    pytest.param(config_edit(qk_norm_for_text="true"), ConfigError, "qk_norm_for_text must be true or false",
                 id="bool-string"),
    pytest.param(config_edit(quantization_config="fp8"), ConfigError,
                 "quantization_config must be an object such as ModelOpt writes .* got 'fp8'",
                 id="quant-config-string"),
    pytest.param(config_edit(quantization_config={"quant_method": "modelopt", "ignore": "proj_in"}), ConfigError,
                 "quantization_config.ignore must be a list, got 'proj_in'", id="ignore-not-a-list"),
    pytest.param(config_edit(quantization_config={"quant_method": "modelopt", "config_groups": {"group_0": "fp8"}}),
                 ConfigError, "quantization_config.config_groups.group_0 must be an object", id="group-not-an-object"),
]


@pytest.mark.parametrize("damage,error,message", DAMAGE)
def test_header_damage_is_refused_at_inspect_and_at_load_with_the_same_message(sharded, tmp_path, damage, error,
                                                                             message):
    d = copy_of(sharded, tmp_path / "transformer")
    where = damage(d)
    with pytest.raises(error, match=message) as at_inspect:
        inspect(d)
    assert str(where) in str(at_inspect.value)  # the file is named
    with pytest.raises(error) as at_load:
        load_transformer(d)
    assert str(at_load.value) == str(at_inspect.value)


def test_an_intact_checkpoint_inspects_without_torch(sharded):
    """farm validate runs on machines without torch: the reader must not import it."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from cosmos3.rules.checkpoint_header import inspect\n"
            f"facts = inspect({str(sharded)!r})\n"
            "print(facts.config.hidden_size, len(facts.tensors), sorted(facts.fp8_modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "64"
    assert int(out[1]) == len(load_file_keys(sharded))
    assert out[2] == "[]"  # BF16: no FP8 Linears


def load_file_keys(directory: Path) -> set[str]:
    return set(json.loads((directory / INDEX).read_text())["weight_map"])
