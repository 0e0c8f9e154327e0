"""Packed static-FP8 projections (cosmos3/layers/packed.py): one GEMM for a tower's Q/K/V, which read one input.

CPU tests (CI): the packed weights are the layers' own parameters (state_dict unchanged, nothing twice), a packed
group gives each projection's split output bit for bit, it stands down where it must (16-bit input, too many
tokens, a member moved, scales changed under a capture), and a toy static-FP8 model's velocity is the same bits
packed or split. GPU tests (``-m gpu``, on an H200): the same at Nano's shapes through cuBLAS, and the toy model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cosmos3 import load_transformer
from cosmos3.layers import packed as packed_module
from cosmos3.layers.linear import Linear
from cosmos3.layers.packed import PACKED_MAX_TOKENS, PackedProjections
from cosmos3.ops import FP8
from cosmos3.quant import STATIC_FP8, UNQUANTIZED

TOY_FP8 = Path(__file__).resolve().parents[2] / "checkpoints" / "toy" / "fp8"


def static_linears(sizes, in_features, device="cpu", seed=0):
    """Static-FP8 linears of output widths ``sizes`` with random weights and scales, loaded as a checkpoint is."""
    g = torch.Generator().manual_seed(seed)
    with torch.device(device):
        linears = [Linear(in_features, n, quant_method=STATIC_FP8, dtype=torch.bfloat16) for n in sizes]
        group = PackedProjections.of(linears)
    input_scale = torch.rand((), generator=g) * 0.01 + 0.001  # one input, one calibrated input_scale
    for i, linear in enumerate(linears):
        tensors = {"weight": (torch.randn(linear.out_features, in_features, generator=g) * 50).clamp(-448, 448).to(FP8),
                   "weight_scale": torch.rand((), generator=g) * 0.01 + 0.001 * (i + 1),
                   "input_scale": input_scale.clone()}
        STATIC_FP8.load_weights(linear, {"": {k: v.to(device) for k, v in tensors.items()}}, f"proj{i}")
    return linears, group


def fp8_input(tokens, in_features, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, in_features, generator=g) * 100).clamp(-448, 448).to(FP8).to(device)


@pytest.fixture
def packs_everywhere(monkeypatch):
    """Packing on any device and size (the CPU never packs on its own: nothing to gain there)."""
    monkeypatch.setattr(packed_module, "max_tokens", lambda device: 1 << 20)


def test_packed_weights_are_the_layers_own_parameters():
    linears, group = static_linears((48, 16, 16), 32)
    offset = 0
    for linear in linears:
        assert linear.weight.shape == (linear.out_features, 32) and linear.weight.is_contiguous()
        assert linear.weight.data_ptr() == group.weight.data_ptr() + offset * 32  # a row slice: held once
        assert torch.equal(group.weight[offset:offset + linear.out_features].view(torch.uint8),
                           linear.weight.view(torch.uint8))
        offset += linear.out_features
    module = torch.nn.ModuleList(linears)
    assert {k for k in module.state_dict()} == {f"{i}.{s}" for i in range(3)
                                                  for s in ("weight", "weight_scale", "input_scale")}


def test_only_bias_free_static_fp8_groups_pack():
    static = [Linear(8, 16, quant_method=STATIC_FP8, dtype=torch.bfloat16) for _ in range(2)]
    assert PackedProjections.of(static) is not None
    mixed = [Linear(8, 16, quant_method=STATIC_FP8, dtype=torch.bfloat16),
             Linear(8, 16, quant_method=UNQUANTIZED, dtype=torch.bfloat16)]
    assert PackedProjections.of(mixed) is None
    biased = [Linear(8, 16, quant_method=STATIC_FP8, dtype=torch.bfloat16, bias=True) for _ in range(2)]
    assert PackedProjections.of(biased) is None


def test_packed_gemm_gives_each_projection_its_split_output_bit_for_bit(packs_everywhere):
    linears, group = static_linears((96, 32, 32), 64)
    group.refresh()
    x = fp8_input(37, 64)
    assert group.wants(x)
    for linear, out in zip(linears, group(x), strict=True):
        assert out.shape == (37, linear.out_features)
        assert torch.equal(out, linear(x))


def test_a_group_stands_down_where_it_must(packs_everywhere, monkeypatch):
    linears, group = static_linears((32, 32), 64)
    group.refresh()
    x = fp8_input(8, 64)
    assert group.wants(x)
    assert not group.wants(torch.randn(8, 64, dtype=torch.bfloat16))  # a 16-bit step: no shared FP8 input
    monkeypatch.setattr(packed_module, "max_tokens", lambda device: 7)
    group.refresh()
    assert not group.wants(x)  # more tokens than the device's row packs
    monkeypatch.setattr(packed_module, "max_tokens", lambda device: 1 << 20)
    group.refresh()
    linears[1].weight = torch.nn.Parameter(linears[1].weight.clone(), False)  # moved off the buffer (.to())
    assert not group.wants(x)


def test_changed_scales_are_picked_up_but_never_made_inside_a_capture(packs_everywhere, monkeypatch):
    linears, group = static_linears((32, 32), 64)
    group.refresh()
    x = fp8_input(8, 64)
    linears[0].weight_scale.mul_(2.0)  # in place: the column scales made at load are stale
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not group.wants(x)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert group.wants(x)
    for linear, out in zip(linears, group(x), strict=True):
        assert torch.equal(out, linear(x))


def toy_velocities(device: str) -> list[torch.Tensor]:
    """The toy static-FP8 model's velocity at two noise levels (CFG-free), loaded fresh on ``device``."""
    model = load_transformer(TOY_FP8, device=device, step_precision="off")
    ids = torch.tensor([3, 1, 4, 1, 5], device=device)
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(16, 2, 4, 4, generator=g).to(device, torch.bfloat16)
    return [model.velocity(ids, latents, t, fps=24.0).float().cpu() for t in (900.0, 300.0)]


def test_toy_model_velocity_is_the_same_bits_packed_or_split(monkeypatch):
    split = toy_velocities("cpu")
    calls = []
    real = PackedProjections.__call__
    monkeypatch.setattr(PackedProjections, "__call__", lambda self, x: calls.append(1) or real(self, x))
    monkeypatch.setattr(packed_module, "max_tokens", lambda device: 1 << 20)
    packed = toy_velocities("cpu")
    assert calls, "the packed path never ran"
    for a, b in zip(packed, split, strict=True):
        assert torch.equal(a, b)


# --- GPU (H200) ---

@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [4096, 1024, 77])
def test_gpu_packed_nano_qkv_equals_the_split_gemms_bit_for_bit(tokens):
    if packed_module.max_tokens(torch.device("cuda")) < tokens:
        pytest.skip(f"this GPU's SM has no packing row for {tokens} tokens (PACKED_MAX_TOKENS: {PACKED_MAX_TOKENS})")
    linears, group = static_linears((4096, 1024, 1024), 4096, device="cuda")
    group.refresh()
    x = fp8_input(tokens, 4096, device="cuda")
    assert group.wants(x)
    for linear, out in zip(linears, group(x), strict=True):
        assert torch.equal(out, linear(x))


@pytest.mark.gpu
def test_gpu_toy_model_velocity_is_the_same_bits_packed_or_split(monkeypatch):
    if packed_module.max_tokens(torch.device("cuda")) == 0:
        pytest.skip(f"this GPU's SM never packs (PACKED_MAX_TOKENS: {PACKED_MAX_TOKENS})")
    calls = []
    real = PackedProjections.__call__
    monkeypatch.setattr(PackedProjections, "__call__", lambda self, x: calls.append(1) or real(self, x))
    packed = toy_velocities("cuda")
    assert calls, "the packed path never ran"
    monkeypatch.setattr(packed_module, "PACKED_MAX_TOKENS", {})
    split = toy_velocities("cuda")
    for a, b in zip(packed, split, strict=True):
        assert torch.equal(a, b)
