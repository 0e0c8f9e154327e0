"""The threaded checkpoint reader against safetensors' own loader: same bytes, any order, any piece size."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from cosmos3.checkpoint import tensor_reader
from cosmos3.checkpoint.weights import CheckpointFiles
from cosmos3.errors import CheckpointError


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w8": (torch.randn(37, 29, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn),
        "bf16": torch.randn(5, 301, generator=g).bfloat16(),
        "f16": torch.randn(777, generator=g).half(),
        "scale": torch.tensor(0.0123),  # 0-d, 4 bytes
        "f32": torch.randn(3, 4, 5, generator=g),
    }


@pytest.fixture()
def shards(tmp_path):
    """Two shards and their index, as a sharded export writes them."""
    a, b = _tensors(1), {f"b.{k}": v for k, v in _tensors(2).items()}
    save_file(a, tmp_path / "model-00001-of-00002.safetensors")
    save_file(b, tmp_path / "model-00002-of-00002.safetensors")
    weight_map = {**dict.fromkeys(a, "model-00001-of-00002.safetensors"),
                  **dict.fromkeys(b, "model-00002-of-00002.safetensors")}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expected = {**load_file(tmp_path / "model-00001-of-00002.safetensors"),
                **load_file(tmp_path / "model-00002-of-00002.safetensors")}
    return tmp_path, expected


def _same_bytes(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape) and torch.equal(
        ours.cpu().reshape(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 20])  # pieces that split elements, tensors, or none
@pytest.mark.parametrize("ahead", [1, 4096, 1 << 30])  # one tensor at a time, a few, all
def test_a_planned_read_in_any_order_gives_safetensors_bytes(shards, monkeypatch, chunk, ahead):
    directory, expected = shards
    monkeypatch.setattr(tensor_reader, "CHUNK", chunk)
    monkeypatch.setattr(tensor_reader, "AHEAD", ahead)
    files = CheckpointFiles(directory)
    order = sorted(expected, key=lambda k: (k[::-1], k))  # across shards, not in file order
    files.plan(order)
    for key in order:
        assert _same_bytes(files.get(key), expected[key]), key
    assert files.bytes_read == sum(t.numel() * t.element_size() for t in expected.values())


def test_an_unplanned_key_is_read_on_its_own(shards):
    directory, expected = shards
    files = CheckpointFiles(directory)
    files.plan(["w8", "bf16"])
    assert _same_bytes(files.get("b.scale"), expected["b.scale"])  # not in the plan
    assert _same_bytes(files.get("w8"), expected["w8"])
    assert _same_bytes(files.get("bf16"), expected["bf16"])


def test_taking_out_of_plan_order_says_what_was_expected(shards):
    files = CheckpointFiles(shards[0])
    files.plan(["w8", "bf16"])
    with pytest.raises(RuntimeError, match="asked for bf16, the plan has w8 next"):
        files._planned.take("bf16")
    files.close()


def test_a_shard_truncated_after_its_header_was_read_names_the_file_and_tensor(shards, monkeypatch):
    directory, _ = shards
    monkeypatch.setattr(tensor_reader, "CHUNK", 64)
    files = CheckpointFiles(directory)  # headers read and checked while the file was whole
    shard = directory / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    last = max((h for h in files.headers.values() if h.file == shard), key=lambda h: h.offset)
    files.plan([last.key])
    with pytest.raises(CheckpointError, match=rf"{shard.name}: the file ends inside {last.key}'s data"):
        files.get(last.key)
    files.close()


@pytest.mark.gpu
def test_a_planned_read_to_cuda_gives_safetensors_bytes(shards, monkeypatch):
    directory, expected = shards
    monkeypatch.setattr(tensor_reader, "CHUNK", 1000)  # many pieces through the pinned buffers
    files = CheckpointFiles(directory, device="cuda")
    files.plan(list(expected))
    for key in expected:
        tensor = files.get(key)
        assert tensor.device.type == "cuda"
        assert _same_bytes(tensor, expected[key]), key
