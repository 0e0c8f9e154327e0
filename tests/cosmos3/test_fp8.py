"""Static FP8 (ModelOpt) checkpoints load exactly, keep projections split and quantize shared inputs once."""

from __future__ import annotations

import json

import pytest
import torch

import cosmos3.quant.fp8_static as fp8_static
from cosmos3 import load_transformer, uses_static_fp8
from cosmos3.checkpoint import SKIPPED, CheckpointFiles
from cosmos3.checkpoint_header import linear_sites
from cosmos3.errors import CheckpointError, ConfigError
from cosmos3.layers.linear import Linear
from cosmos3.quant.fp8_static import MODELOPT_BUFFERS
from tests.cosmos3.checkpoint_files import write_sharded
from tests.cosmos3.fp8_checkpoints import PROMPTS, make_bf16, make_fp8

LAYERS = 2
TOP_LINEARS = ("proj_in", "proj_out", "time_embedder.linear_1", "time_embedder.linear_2")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    bf16 = make_bf16(root / "bf16")
    return bf16, make_fp8(bf16, root / "fp8")


def all_tensors(path):
    files = CheckpointFiles(path)
    return {key: files.get(key) for key in files.keys()}, json.loads((path / "config.json").read_text())


def rewrite(path, dst, edit_tensors=None, edit_config=None):
    tensors, config = all_tensors(path)
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    return write_sharded(tensors, dst, num_shards=2, config=config)


def sample(seed=0):
    g = torch.Generator().manual_seed(seed)
    return PROMPTS[0], torch.randn(4, 2, 4, 4, generator=g)


def test_predicate_follows_the_published_quantization_config(ckpts):
    bf16, fp8 = ckpts
    assert uses_static_fp8(json.loads((fp8 / "config.json").read_text()))
    assert not uses_static_fp8(json.loads((bf16 / "config.json").read_text()))
    dynamic = json.loads((fp8 / "config.json").read_text())
    dynamic["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = True
    assert not uses_static_fp8(dynamic)


def test_every_checkpoint_tensor_loads_bit_for_bit_under_its_own_name(ckpts):
    _, fp8 = ckpts
    tensors, _ = all_tensors(fp8)
    # The test can only tell fusion from no fusion if a group's weight scales differ.
    scales = [tensors[f"layers.0.self_attn.add_{x}_proj.weight_scale"].item() for x in "qkv"]
    assert len(set(scales)) == 3, scales
    gate_up = [tensors[f"layers.1.mlp_moe_gen.{x}_proj.weight_scale"].item() for x in ("gate", "up")]
    assert gate_up[0] != gate_up[1]

    state = load_transformer(fp8).state_dict()
    expected = {k: v for k, v in tensors.items()
                if k not in SKIPPED and not any(k.endswith(b) for b in MODELOPT_BUFFERS)}
    assert set(expected) <= set(state)
    for key, tensor in expected.items():
        assert state[key].dtype == tensor.dtype, key
        assert state[key].shape == tensor.shape, key
        assert torch.equal(state[key].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), key
    assert state["layers.0.self_attn.add_q_proj.weight"].dtype == torch.float8_e4m3fn


def linear_names(model):
    return sorted(name.split(".", 2)[2] for name, m in model.named_modules()
                  if isinstance(m, Linear) and name.startswith("layers.0."))


def test_topology_follows_quantization_in_every_direction(ckpts):
    bf16, fp8 = ckpts
    static = load_transformer(fp8)
    fused = ["mlp.down_proj", "mlp.gate_up_proj", "mlp_moe_gen.down_proj", "mlp_moe_gen.gate_up_proj",
             "self_attn.add_qkv_proj", "self_attn.to_add_out", "self_attn.to_out", "self_attn.to_qkv"]
    assert linear_names(static) == sorted(
        [f"self_attn.{n}" for n in ("to_q", "to_k", "to_v", "to_out", "add_q_proj", "add_k_proj", "add_v_proj",
                                    "to_add_out")]
        + [f"{m}.{p}_proj" for m in ("mlp", "mlp_moe_gen") for p in ("gate", "up", "down")])
    # Every Linear the model builds is a site the header reader knows (the two lists are one rule).
    assert {n for n, m in static.named_modules() if isinstance(m, Linear)} == linear_sites(static.config)
    assert sum(isinstance(m, Linear) for m in static.modules()) == 14 * LAYERS + len(TOP_LINEARS)
    for precision in ("bf16", "fp8-dynamic"):
        model = load_transformer(bf16, precision=precision)
        assert linear_names(model) == sorted(fused), precision
        assert sum(isinstance(m, Linear) for m in model.modules()) == 8 * LAYERS + len(TOP_LINEARS)


def test_shared_quantization_is_one_quantization_per_group(ckpts, monkeypatch):
    _, fp8 = ckpts
    model = load_transformer(fp8)
    ids, latents = sample()
    cache = model.encode_text(ids)
    calls = []
    real = fp8_static.ops.quantize_fp8
    monkeypatch.setattr(fp8_static.ops, "quantize_fp8", lambda x, s: calls.append(1) or real(x, s))
    seen = {}
    attn = model.layers[0].self_attn
    hooks = [getattr(attn, n).register_forward_pre_hook(lambda m, a, n=n: seen.__setitem__(n, a[0]))
             for n in ("add_q_proj", "add_k_proj", "add_v_proj")]
    model.velocity(ids, latents, 500.0, und_cache=cache)
    for hook in hooks:
        hook.remove()
    # GEN per layer: one for Q/K/V, one for to_add_out, one for gate/up; swiglu emits FP8 for down_proj.
    assert len(calls) == 3 * LAYERS
    assert len({t.data_ptr() for t in seen.values()}) == 1
    assert all(t.dtype == torch.float8_e4m3fn for t in seen.values())


def relative_rms(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).norm() / ref.norm()).item()


def test_static_fp8_velocity_is_close_to_the_bf16_model_it_came_from(ckpts):
    """Per-tensor e4m3 keeps 3 mantissa bits: one rounding carries ~2.5% RMS relative error.

    A W8A8 projection rounds both operands (measured ~4% RMS on one Linear here); a GEN layer
    chains four quantized GEMMs plus the UND K/V it reads, two layers deep: measured 6.7-9.4%
    RMS over four seeds on this random tiny model. Pinned at 15%; a wrong or swapped scale
    errs by 100% or more. (Exactness against second roundings is tested bit for bit above.)
    """
    bf16, fp8 = ckpts
    ids, latents = sample(3)
    ref = load_transformer(bf16, dtype=torch.float32).velocity(ids, latents, 600.0, fps=24.0)
    ours = load_transformer(fp8, dtype=torch.float32).velocity(ids, latents, 600.0, fps=24.0)
    assert 1e-3 < relative_rms(ours, ref) < 0.15


def test_dynamic_fp8_runs_a_bf16_checkpoint_close_to_bf16(ckpts):
    bf16, _ = ckpts
    ids, latents = sample(4)
    ref = load_transformer(bf16, dtype=torch.float32).velocity(ids, latents, 300.0)
    ours = load_transformer(bf16, dtype=torch.float32, precision="fp8-dynamic").velocity(ids, latents, 300.0)
    assert 1e-3 < relative_rms(ours, ref) < 0.15  # same argument as the static bound


def test_group_with_differing_input_scales_is_refused_by_name(ckpts, tmp_path):
    _, fp8 = ckpts

    def skew(t):
        t["layers.1.self_attn.to_k.input_scale"] = t["layers.1.self_attn.to_k.input_scale"] * 2
        t["layers.1.self_attn.to_k.input_quantizer._amax"] = t["layers.1.self_attn.to_k.input_scale"] * 448
    bad = rewrite(fp8, tmp_path / "bad", skew)
    with pytest.raises(CheckpointError, match=r"layers.1.self_attn: .*to_q.input_scale=.*to_k.input_scale="):
        load_transformer(bad)


def scale_times(key, factor):
    return lambda t: t.update({key: t[key] * factor})


@pytest.mark.parametrize("edit,message", [
    pytest.param(scale_times("layers.0.mlp.up_proj.weight_quantizer._amax", 1.5),
                 r"layers.0.mlp.up_proj.weight_quantizer._amax .* disagrees", id="modelopt-buffer-disagrees"),
    pytest.param(lambda t: t.update({"layers.0.mlp.down_proj.weight_scale":
                                     t["layers.0.mlp.down_proj.weight_scale"].bfloat16()}),
                 "layers.0.mlp.down_proj.weight_scale is BF16; ModelOpt writes float32 scales", id="scale-not-fp32"),
])
def test_inconsistent_scales_are_refused(ckpts, tmp_path, edit, message):
    _, fp8 = ckpts
    with pytest.raises(CheckpointError, match=message):
        load_transformer(rewrite(fp8, tmp_path / "bad", edit))


def test_static_recipe_against_an_unquantized_checkpoint_is_refused(ckpts, tmp_path):
    bf16, fp8 = ckpts
    quant = json.loads((fp8 / "config.json").read_text())["quantization_config"]
    bad = rewrite(bf16, tmp_path / "bad", edit_config=lambda c: c.update(quantization_config=quant))
    with pytest.raises(CheckpointError, match="declares ModelOpt static FP8 but no weight is FP8"):
        load_transformer(bad)


def test_ignored_modules_stay_high_precision_and_load(ckpts, tmp_path):
    bf16, _ = ckpts
    out = make_fp8(bf16, tmp_path / "ignored", ignore=["layers.0.self_attn.to_q", "layers.1.mlp.down_proj"])
    state = load_transformer(out).state_dict()
    assert state["layers.0.self_attn.to_q.weight"].dtype == torch.bfloat16
    assert "layers.0.self_attn.to_q.input_scale" not in state
    assert state["layers.0.self_attn.to_k.weight"].dtype == torch.float8_e4m3fn
    assert state["layers.1.mlp.down_proj.weight"].dtype == torch.bfloat16
    # Embeddings and norms are high precision under any recipe.
    assert state["embed_tokens.weight"].dtype == torch.bfloat16


def test_static_scale_for_a_high_precision_destination_is_refused(ckpts, tmp_path):
    bf16, _ = ckpts
    out = make_fp8(bf16, tmp_path / "ignored", ignore=["layers.1.mlp.down_proj"])
    bad = rewrite(out / "", tmp_path / "bad",
                  lambda t: t.update({"layers.1.mlp.down_proj.input_scale": torch.tensor(0.01)}))
    with pytest.raises(CheckpointError, match="layers.1.mlp.down_proj.input_scale: a static FP8 scale for "
                                              "layers.1.mlp.down_proj, whose weight is BF16"):
        load_transformer(bad)


@pytest.mark.parametrize("axis", ["tp_size", "ulysses_size", "cfg_size", "cp_size", "parallel_vae_size"])
def test_static_fp8_with_a_parallel_axis_above_1_is_refused(ckpts, axis):
    bf16, fp8 = ckpts
    with pytest.raises(ConfigError, match=f"static FP8 runs one GPU per worker; got parallel.{axis}=2"):
        load_transformer(fp8, parallel={axis: 2})
    load_transformer(bf16, parallel={axis: 2})  # BF16 is not refused here


@pytest.mark.parametrize("kwargs,message", [
    pytest.param({"precision": "fp8-dynamic"}, "forced dynamic quantization on a split GatedMLP", id="force-dynamic"),
    pytest.param({"precision": "bf16"}, "would re-quantize calibrated weights", id="force-bf16"),
    pytest.param({"lora": "adapter.safetensors"}, "LoRA adapters are not supported .static FP8", id="lora"),
])
def test_options_that_would_change_a_static_checkpoint_are_refused(ckpts, kwargs, message):
    _, fp8 = ckpts
    with pytest.raises(ConfigError, match=message):
        load_transformer(fp8, **kwargs)


@pytest.mark.gpu
def test_static_fp8_on_cuda_scaled_mm_matches_cpu(ckpts):
    """torch._scaled_mm on the H200: as close to the BF16 model as the CPU path is (same bound).

    CPU and GPU accumulate in different orders, so an activation near an e4m3 rounding boundary
    can land one FP8 step (6%) apart and propagate; measured 3.4% RMS between them, far from the
    100%+ of a wrong scale.
    """
    bf16, fp8 = ckpts
    ids, latents = sample(5)
    reference = load_transformer(bf16, dtype=torch.float32).velocity(ids, latents, 500.0, fps=24.0)
    cpu = load_transformer(fp8, dtype=torch.bfloat16).velocity(ids, latents, 500.0, fps=24.0).float()
    gpu = load_transformer(fp8, device="cuda", dtype=torch.bfloat16).velocity(ids.cuda(), latents.cuda(), 500.0,
                                                                              fps=24.0).cpu().float()
    assert relative_rms(gpu, cpu) < 0.1
    assert relative_rms(gpu, reference) < 0.15  # the CPU bound of test_static_fp8_velocity_is_close...
