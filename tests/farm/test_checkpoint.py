"""The driver's torch-free static-FP8 predicate, held to cosmos3.config's where that module exists."""

from __future__ import annotations

import copy

import pytest

from farm import checkpoint
from tests.farm.helpers import STATIC_FP8_QUANT, make_checkpoint


def _with(**changes) -> dict:
    quant = copy.deepcopy(STATIC_FP8_QUANT)
    quant.update(changes)
    return {"quantization_config": quant}


def _dynamic_inputs() -> dict:
    config = _with()
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = True
    return config


CONFIGS = [
    pytest.param(_with(), True, id="modelopt-static-fp8"),
    pytest.param({}, False, id="bf16"),
    pytest.param({"quantization_config": None}, False, id="null-quantization"),
    pytest.param(_dynamic_inputs(), False, id="dynamic-activations"),
    pytest.param(_with(quant_method="fp8"), False, id="not-modelopt"),
    pytest.param(_with(quant_algo="NVFP4"), False, id="nvfp4"),
    pytest.param(_with(weight_only=True), False, id="weight-only"),
    pytest.param(_with(config_groups={}), False, id="no-groups"),
]


@pytest.mark.parametrize("config, expected", CONFIGS)
def test_uses_static_fp8(config, expected):
    assert checkpoint.uses_static_fp8(config) is expected


@pytest.mark.parametrize("config, expected", CONFIGS)
def test_agrees_with_cosmos3_config(config, expected):
    cosmos3_config = pytest.importorskip("cosmos3.config")
    assert cosmos3_config.uses_static_fp8(config) is checkpoint.uses_static_fp8(config)


def test_fingerprint_ignores_the_folder_but_not_the_configs(tmp_path):
    first = make_checkpoint(tmp_path / "a")
    second = make_checkpoint(tmp_path / "b")
    assert checkpoint.fingerprint(first) == checkpoint.fingerprint(second)
    make_checkpoint(second, static_fp8=True)
    assert checkpoint.fingerprint(first) != checkpoint.fingerprint(second)


def test_fingerprint_sees_a_resized_weight_shard(tmp_path):
    root = make_checkpoint(tmp_path / "a")
    shard = root / "transformer" / "diffusion_pytorch_model.safetensors"
    shard.write_bytes(b"0" * 8)
    before = checkpoint.fingerprint(root)
    shard.write_bytes(b"0" * 16)
    assert checkpoint.fingerprint(root) != before
