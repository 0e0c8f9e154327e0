"""Whatever ModelOpt writes, we load: static FP8 exports of the real tool, loaded exactly and run as exported.

Every checkpoint here is made by ModelOpt (``mtq.quantize`` with FP8_DEFAULT_CFG, max calibration,
``export_hf_checkpoint``) from a tiny random diffusers ``Cosmos3OmniTransformer``: the cosmos recipe
(proj_in and time_embedder excluded, as published), the stock recipe (they are quantized), the
component alone and a whole diffusers pipeline in small shards. The expectation each output is held
to is computed from the exported files alone: an fp32 emulation in diffusers' own model.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from diffusers import Cosmos3OmniTransformer
from safetensors.torch import load_file

import cosmos3.quant.fp8_static as fp8_static
from cosmos3 import load_transformer, uses_static_fp8
from cosmos3.checkpoint.weights import SKIPPED
from cosmos3.diffusers_model import reference_forward
from cosmos3.errors import CheckpointError, ConfigError
from cosmos3.layers.linear import Linear
from cosmos3.ops import FP8, FP8_MAX
from cosmos3.quant.fp8_static import StaticFP8LinearMethod
from cosmos3.quant.unquantized import UnquantizedLinearMethod
from cosmos3.rules.checkpoint_header import linear_sites
from testbed.fp8_checkpoints import PROMPTS, make_bf16, make_fp8
from testbed.reference import SUPER_SHAPED, diffusers_pipeline
from tests.cosmos3.checkpoint_files import write_sharded
from tests.tiny_checkpoint import make_tiny_checkpoint

LAYERS = 2
TOP_LINEARS = ("proj_in", "proj_out", "time_embedder.linear_1", "time_embedder.linear_2")
EMULATION_BOUND = 1e-4  # median relative L2 of our velocity against the fp32 emulation


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{name: transformer dir} for the BF16 source and each ModelOpt export."""
    root = tmp_path_factory.mktemp("fp8")
    bf16 = make_bf16(root / "bf16")
    return {"bf16": bf16, "cosmos": make_fp8(bf16, root / "cosmos"), "stock": make_fp8(bf16, root / "stock",
                                                                                         recipe="stock"),
            "super-shaped": make_fp8(make_bf16(root / "super-bf16", **SUPER_SHAPED), root / "super-shaped")}


@pytest.fixture(scope="module")
def pipeline_export(tmp_path_factory):
    """ModelOpt's export of a whole diffusers pipeline (every component, small shards): the root."""
    from modelopt.torch.export import export_hf_checkpoint

    from cosmos3.checkpoint.fp8_export import quantize
    from cosmos3.pipeline import Cosmos3Pipeline

    src = make_tiny_checkpoint(tmp_path_factory.mktemp("pipe") / "bf16")
    pipe = diffusers_pipeline(src, Cosmos3Pipeline.from_pretrained(src))
    pipe.transformer.to(torch.bfloat16)
    pipe.transformer.time_embedder.float()

    def loop(model):
        g = torch.Generator().manual_seed(0)
        for t in (999.0, 500.0, 10.0):
            latents = torch.randn(model.config.latent_channel, 2, 4, 4, generator=g)
            reference_forward(model, torch.tensor([5, 9, 17, 3]), latents.bfloat16(), t, fps=24.0)

    quantize(pipe.transformer, loop)
    dst = tmp_path_factory.mktemp("pipe") / "fp8"
    export_hf_checkpoint(pipe, export_dir=dst, max_shard_size="24KB")
    return dst


def file_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a transformer dir, read straight from its shards (not through our reader)."""
    tensors = {}
    for shard in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def config_of(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def sample(seed=0, channels=4):
    g = torch.Generator().manual_seed(seed)
    return PROMPTS[seed % len(PROMPTS)], torch.randn(channels, 2, 4, 4, generator=g)


def relative_l2(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).norm() / ref.norm()).item()


# ---------------------------------------------------------------- what ModelOpt writes


def test_modelopt_writes_the_published_static_fp8_layout(exports):
    quant = config_of(exports["cosmos"])["quantization_config"]
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    assert quant["config_groups"] == {"group_0": {"weights": fp8, "input_activations": fp8, "targets": ["Linear"]}}
    assert (quant["quant_method"], quant["quant_algo"], quant["producer"]["name"]) == ("modelopt", "FP8", "modelopt")
    assert {"proj_in", "proj_out", "time_embedder*", "lm_head"} <= set(quant["ignore"])
    assert "proj_in" not in config_of(exports["stock"])["quantization_config"]["ignore"]
    tensors = file_tensors(exports["cosmos"])
    assert not [k for k in tensors if "_quantizer" in k]  # no _amax / _scale buffers
    assert tensors["layers.0.self_attn.add_q_proj.weight_scale"].shape == ()  # 0-d fp32 scales
    assert tensors["time_embedder.linear_1.weight"].dtype == torch.float32  # fp32, not bf16
    assert len(list(exports["cosmos"].glob("*.safetensors"))) > 1  # sharded
    assert uses_static_fp8(config_of(exports["cosmos"]))
    assert not uses_static_fp8(config_of(exports["bf16"]))


def loaded_and_file(case, exports, pipeline_export):
    if case == "pipeline":
        return load_transformer(pipeline_export), file_tensors(pipeline_export / "transformer")
    return load_transformer(exports[case]), file_tensors(exports[case])


@pytest.mark.parametrize("case", ["cosmos", "stock", "pipeline", "super-shaped"])
def test_every_exported_tensor_loads_bit_for_bit_under_its_own_name(exports, pipeline_export, case):
    model, tensors = loaded_and_file(case, exports, pipeline_export)
    state = model.state_dict()
    fp8 = [k for k, t in tensors.items() if t.dtype == FP8]
    assert len(fp8) >= 14 * LAYERS
    for key, tensor in tensors.items():
        if key in SKIPPED:
            continue
        assert state[key].dtype == tensor.dtype, key
        assert state[key].shape == tensor.shape, key
        assert torch.equal(state[key].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), key


def emulated_reference(tensors: dict[str, torch.Tensor], config: dict) -> Cosmos3OmniTransformer:
    """diffusers' model in fp32 computing what the export says: e4m3 weights times weight_scale, and each
    quantized layer's input rounded to e4m3 at its input_scale. Built from the files alone."""
    model = Cosmos3OmniTransformer.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    quantized = {k.removesuffix(".weight") for k, t in tensors.items() if k.endswith(".weight") and t.dtype == FP8}
    state = {k: t.float() for k, t in tensors.items() if not k.endswith("_scale")}
    for name in quantized:
        state[f"{name}.weight"] = tensors[f"{name}.weight"].float() * tensors[f"{name}.weight_scale"].float()
    model.load_state_dict(state, strict=True)
    for name in quantized:
        scale = tensors[f"{name}.input_scale"].float()

        def fake_quant(module, args, scale=scale):
            x = args[0].float()
            return ((x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale,)
        model.get_submodule(name).register_forward_pre_hook(fake_quant)
    return model.eval()


@pytest.mark.parametrize("case", ["cosmos", "stock", "super-shaped"])
def test_velocity_equals_an_fp32_emulation_of_the_exported_tensors(exports, case):
    """Our W8A8 (scaled GEMMs on e4m3 operands) against diffusers' model running the dequantized file.

    The two differ only in summation order (~1e-7 in fp32); a value that lands on an e4m3
    rounding boundary can still round the other way in one of them and carry one FP8 step (6%)
    of one element downstream, so the bound is on the median over samples.
    """
    directory = exports[case]
    ours = load_transformer(directory, dtype=torch.float32, step_precision="off")
    reference = emulated_reference(file_tensors(directory), config_of(directory))
    errors = []
    for seed in range(5):
        ids, latents = sample(seed)
        t = 900.0 - 200.0 * seed
        expected, _ = reference_forward(reference, ids, latents, t, fps=24.0)
        errors.append(relative_l2(ours.velocity(ids, latents, t, fps=24.0), expected))
    print(f"\n{case}: relative L2 to the fp32 emulation per sample: {[f'{e:.1e}' for e in errors]}")
    assert statistics.median(errors) <= EMULATION_BOUND, errors


def test_stock_recipe_runs_proj_in_and_time_embedder_w8a8_as_the_emulation_does(exports):
    stock = load_transformer(exports["stock"], dtype=torch.float32)
    cosmos = load_transformer(exports["cosmos"], dtype=torch.float32)
    tensors = file_tensors(exports["stock"])
    reference = emulated_reference(tensors, config_of(exports["stock"]))
    g = torch.Generator().manual_seed(7)
    for name in ("proj_in", "time_embedder.linear_1", "time_embedder.linear_2"):
        ours = stock.get_submodule(name)
        assert type(ours.quant_method) is StaticFP8LinearMethod, name
        assert type(cosmos.get_submodule(name).quant_method) is UnquantizedLinearMethod, name
        x = torch.randn(9, ours.in_features, generator=g) * tensors[f"{name}.input_scale"] * 100
        expected = reference.get_submodule(name)(x)
        assert relative_l2(ours(x), expected) < 1e-6, name
    for model in (stock, cosmos):  # ModelOpt's defaults keep proj_out high precision in both recipes
        assert type(model.proj_out.quant_method) is UnquantizedLinearMethod


def test_quantized_top_linears_follow_the_step_policy_with_the_gen_tower(exports, tmp_path):
    from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY
    from cosmos3.quant import STATIC_FP8, W8A16

    def policy(c):
        c["quantization_config"]["runtime"] = {"diffusion_step_policy": PUBLISHED_STEP_POLICY}
    model = load_transformer(rewrite(exports["stock"], tmp_path / "p", edit_config=policy))
    model.set_denoising_step(0, 10)
    assert model.proj_in.method is W8A16 and model.time_embedder.linear_1.method is W8A16
    model.set_denoising_step(5, 10)
    assert model.proj_in.method is STATIC_FP8
    assert model.layers[0].self_attn.to_q.method is W8A16  # UND: reasoner a16, whatever the step


def test_fp8_accumulation_reaches_every_fp8_linear_and_the_w8a8_steps(exports, tmp_path):
    """The option picks how every W8A8 GEMM sums, the packed Q/K/V's too, also after a W8A16 step."""
    from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY
    from cosmos3.quant import W8A16

    def policy(c):  # the UND tower W8A8 at every step ("native"), so both towers' methods are checked
        c["quantization_config"]["runtime"] = {"diffusion_step_policy": {**PUBLISHED_STEP_POLICY, "reasoner": "native"}}
    root = rewrite(exports["stock"], tmp_path / "p", edit_config=policy)
    for accumulation in ("fp32", "fast"):
        model = load_transformer(root, fp8_accumulation=accumulation)
        assert model.fp8_accumulation == accumulation
        for step, edge in ((5, False), (0, True), (5, False)):  # W8A8, W8A16, W8A8 again
            model.set_denoising_step(step, 10)
            assert (model.proj_in.method is W8A16) is edge
            fp8 = [m.method for m in model.modules()
                   if isinstance(m, Linear) and m.method.shares_input_quant]  # W8A8 ones
            assert fp8 and {method.accumulation for method in fp8} == {accumulation}, step
        assert model.layers[0].self_attn.to_q.method.accumulation == accumulation  # UND
    assert load_transformer(exports["bf16"]).fp8_accumulation is None  # no FP8 GEMMs to sum


def test_an_unknown_fp8_accumulation_is_refused_with_the_choices(exports):
    with pytest.raises(ConfigError, match=r"fp8_accumulation: must be one of fast, fp32, got 'bf16'"):
        load_transformer(exports["cosmos"], fp8_accumulation="bf16")


# ---------------------------------------------------------------- topology and numerics


def linear_names(model):
    return sorted(name.split(".", 2)[2] for name, m in model.named_modules()
                  if isinstance(m, Linear) and name.startswith("layers.0."))


def test_topology_follows_quantization_in_every_direction(exports):
    static = load_transformer(exports["cosmos"])
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
        model = load_transformer(exports["bf16"], precision=precision)
        assert linear_names(model) == sorted(fused), precision
        assert sum(isinstance(m, Linear) for m in model.modules()) == 8 * LAYERS + len(TOP_LINEARS)


def test_shared_quantization_is_one_quantization_per_group(exports, monkeypatch):
    model = load_transformer(exports["cosmos"])
    ids, latents = sample()
    cache = model.encode_text(ids)
    calls = []
    real = fp8_static.ops.quantize_fp8
    monkeypatch.setattr(fp8_static.ops, "quantize_fp8", lambda x, s: calls.append(1) or real(x, s))
    seen = {}
    layer = model.layers[0]
    groups = {"qkv": (layer.self_attn, ("add_q_proj", "add_k_proj", "add_v_proj")),
              "gate_up": (layer.mlp_moe_gen, ("gate_proj", "up_proj"))}
    hooks = [getattr(module, n).register_forward_pre_hook(lambda m, a, g=g, n=n: seen.__setitem__((g, n), a[0]))
             for g, (module, names) in groups.items() for n in names]
    model.velocity(ids, latents, 500.0, und_cache=cache)
    for hook in hooks:
        hook.remove()
    # The norms before Q/K/V and gate/up emit FP8 themselves; per GEN layer only to_add_out's input is quantized
    # on its own, and swiglu emits FP8 for down_proj.
    assert len(calls) == LAYERS
    for group in groups:
        inputs = [t for (g, _), t in seen.items() if g == group]
        assert len({t.data_ptr() for t in inputs}) == 1, group
        assert all(t.dtype == torch.float8_e4m3fn for t in inputs), group


def test_static_fp8_velocity_is_close_to_the_bf16_model_it_came_from(exports):
    """Per-tensor e4m3 keeps 3 mantissa bits: one rounding carries ~2.5% RMS relative error.

    A GEN layer chains four quantized GEMMs plus the UND K/V it reads, two layers deep; pinned
    at 15%, where a wrong or swapped scale errs by 100% or more. (Exactness is tested above.)
    """
    ids, latents = sample(3)
    ref = load_transformer(exports["bf16"], dtype=torch.float32).velocity(ids, latents, 600.0, fps=24.0)
    ours = load_transformer(exports["cosmos"], dtype=torch.float32).velocity(ids, latents, 600.0, fps=24.0)
    assert 1e-3 < relative_l2(ours, ref) < 0.15


def test_dynamic_fp8_runs_a_bf16_checkpoint_close_to_bf16(exports):
    ids, latents = sample(4)
    ref = load_transformer(exports["bf16"], dtype=torch.float32).velocity(ids, latents, 300.0)
    ours = load_transformer(exports["bf16"], dtype=torch.float32, precision="fp8-dynamic").velocity(ids, latents, 300.0)
    assert 1e-3 < relative_l2(ours, ref) < 0.15  # same argument as the static bound


# ---------------------------------------------------------------- layouts accepted


def rewrite(path, dst, edit_tensors=None, edit_config=None, num_shards=2):
    tensors, config = file_tensors(path), config_of(path)
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    return write_sharded(tensors, dst, num_shards=num_shards, config=config)


def with_modelopt_buffers(t):
    """The ``*_quantizer._amax/_scale`` buffers older exporters (and hand-made files) carry."""
    for key in [k for k in t if k.endswith(".weight_scale")]:
        module = key.removesuffix(".weight_scale")
        t[f"{module}.weight_quantizer._amax"] = t[key] * FP8_MAX
        t[f"{module}.weight_quantizer._scale"] = t[key].clone()
        t[f"{module}.input_quantizer._amax"] = t[f"{module}.input_scale"] * FP8_MAX


def one_element_scales(t):
    for key in [k for k in t if k.endswith("_scale")]:
        t[key] = t[key].reshape(1)


def legacy_names(t):
    for key in [k for k in t if k.startswith("layers.")]:
        t[f"model.{key}"] = t.pop(key)


def legacy_ignore(c):
    """The ignore list in the legacy dialect (sglang remaps it too): vae2llm is proj_in, llm2vae proj_out."""
    legacy = {"proj_in": "vae2llm", "proj_out": "llm2vae"}
    c["quantization_config"]["ignore"] = [legacy.get(name, name) for name in c["quantization_config"]["ignore"]]


@pytest.mark.parametrize("case,edit,edit_config", [
    pytest.param("stock", with_modelopt_buffers, None, id="amax-and-scale-buffers"),
    pytest.param("stock", one_element_scales, None, id="one-element-scales"),
    pytest.param("stock", legacy_names, None, id="model-prefixed-names"),
    pytest.param("cosmos", None, legacy_ignore, id="legacy-names-in-ignore"),
])
def test_other_writers_layouts_load_to_the_same_velocity(exports, tmp_path, case, edit, edit_config):
    ids, latents = sample(2)
    expected = load_transformer(exports[case], dtype=torch.float32).velocity(ids, latents, 400.0, fps=24.0)
    other = rewrite(exports[case], tmp_path / "other", edit, edit_config, num_shards=3)
    assert torch.equal(load_transformer(other, dtype=torch.float32).velocity(ids, latents, 400.0, fps=24.0), expected)


def test_a_pipeline_root_with_hf_quant_config_loads(pipeline_export, tmp_path):
    root = tmp_path / "root"
    for sub in ("transformer", "vae", "scheduler", "text_tokenizer"):
        (root / sub).mkdir(parents=True)
        for f in (pipeline_export / sub).iterdir():
            (root / sub / f.name).write_bytes(f.read_bytes())
    quant = config_of(pipeline_export / "transformer")["quantization_config"]
    (root / "hf_quant_config.json").write_text(json.dumps({"producer": quant["producer"], "quantization": {
        "quant_algo": "FP8", "exclude_modules": quant["ignore"]}}))
    assert torch.equal(load_transformer(root).proj_out.weight, load_transformer(pipeline_export).proj_out.weight)


def test_excluded_modules_stay_high_precision_and_load(exports, tmp_path):
    out = make_fp8(exports["bf16"], tmp_path / "excluded",
                   exclude=["layers.0.self_attn.to_q", "layers.1.mlp.down_proj"])
    assert {"layers.0.self_attn.to_q", "layers.1.mlp.down_proj"} <= set(config_of(out)["quantization_config"]["ignore"])
    state = load_transformer(out).state_dict()
    assert state["layers.0.self_attn.to_q.weight"].dtype == torch.bfloat16
    assert "layers.0.self_attn.to_q.input_scale" not in state
    assert state["layers.0.self_attn.to_k.weight"].dtype == torch.float8_e4m3fn
    assert state["layers.1.mlp.down_proj.weight"].dtype == torch.bfloat16
    assert state["embed_tokens.weight"].dtype == torch.bfloat16  # embeddings and norms: always high precision


# ---------------------------------------------------------------- refused, module named


def drop(key):
    return lambda t: t.pop(key)


def ignore_also(module):
    return lambda c: c["quantization_config"]["ignore"].append(module)


def block_scales(module, shape):
    """A weight_scale per block (or per channel) of ``module``, as a block-wise FP8 export would write."""
    return lambda t: t.update({f"{module}.weight_scale": t[f"{module}.weight_scale"].expand(*shape).clone()})


def embeddings_in_fp8(t):
    t["embed_tokens.weight"] = t["embed_tokens.weight"].float().clamp(-FP8_MAX, FP8_MAX).to(FP8)
    t["embed_tokens.weight_scale"] = torch.tensor(1.0)
    t["embed_tokens.input_scale"] = torch.tensor(1.0)


BAD = [
    pytest.param(drop("layers.0.mlp.up_proj.input_scale"), None,
                 r"layers.0.mlp.up_proj.input_scale is missing: a static W8A8 layer needs", id="missing-input-scale"),
    pytest.param(drop("proj_in.weight_scale"), None, r"proj_in.weight_scale is missing", id="missing-weight-scale"),
    pytest.param(None, ignore_also("layers.1.self_attn.add_k_proj"),
                 r"layers.1.self_attn.add_k_proj: quantized \(FP8 weight\) but quantization_config.ignore lists it",
                 id="quantized-layer-in-ignore"),
    pytest.param(None, ignore_also("time_embedder*"),
                 r"time_embedder.linear_1: quantized .*ignore lists it", id="quantized-glob-in-ignore"),
    pytest.param(block_scales("layers.0.mlp_moe_gen.gate_proj", (2, 2)), None,
                 r"layers.0.mlp_moe_gen.gate_proj.weight_scale has shape \[2, 2\]: block-wise or per-channel",
                 id="block-scales"),
    pytest.param(block_scales("layers.1.self_attn.to_out", (64,)), None,
                 r"layers.1.self_attn.to_out.weight_scale has shape \[64\]", id="channel-scales"),
    pytest.param(embeddings_in_fp8, None, "embed_tokens: FP8 weight on a module with no W8A8 method",
                 id="unknown-quantized-layer-type"),
    pytest.param(lambda t: t.update({"layers.0.mlp.down_proj.weight_scale":
                                     t["layers.0.mlp.down_proj.weight_scale"].bfloat16()}), None,
                 "layers.0.mlp.down_proj.weight_scale is BF16; ModelOpt writes float32 scales", id="scale-not-fp32"),
    pytest.param(None, lambda c: c["quantization_config"].update(quant_algo="NVFP4"),
                 r"hold FP8 weights .* quant_algo='NVFP4'", id="not-fp8-algo"),
]


@pytest.mark.parametrize("edit_tensors,edit_config,message", BAD)
def test_what_cannot_be_honoured_is_refused_with_the_module_named(exports, tmp_path, edit_tensors, edit_config,
                                                                  message):
    from cosmos3.rules.checkpoint_header import inspect

    bad = rewrite(exports["stock"], tmp_path / "bad", edit_tensors, edit_config)
    with pytest.raises(CheckpointError, match=message) as err:
        load_transformer(bad)
    with pytest.raises(CheckpointError) as at_validate:  # what `farm validate` runs
        inspect(bad)
    assert str(at_validate.value) == str(err.value)


def test_group_with_differing_input_scales_is_refused_by_name(exports, tmp_path):
    def skew(t):
        t["layers.1.self_attn.to_k.input_scale"] = t["layers.1.self_attn.to_k.input_scale"] * 2
    bad = rewrite(exports["cosmos"], tmp_path / "bad", skew)
    with pytest.raises(CheckpointError, match=r"layers.1.self_attn: .*to_q.input_scale=.*to_k.input_scale="):
        load_transformer(bad)


def test_modelopt_buffers_that_disagree_with_their_scale_are_refused(exports, tmp_path):
    def skewed_buffers(t):
        with_modelopt_buffers(t)
        t["layers.0.mlp.up_proj.weight_quantizer._amax"] *= 1.5
    with pytest.raises(CheckpointError, match=r"layers.0.mlp.up_proj.weight_quantizer._amax .* disagrees"):
        load_transformer(rewrite(exports["cosmos"], tmp_path / "bad", skewed_buffers))


def test_static_recipe_against_an_unquantized_checkpoint_is_refused(exports, tmp_path):
    quant = config_of(exports["cosmos"])["quantization_config"]
    bad = rewrite(exports["bf16"], tmp_path / "bad", edit_config=lambda c: c.update(quantization_config=quant))
    with pytest.raises(CheckpointError, match="declares ModelOpt static FP8 but no weight is FP8"):
        load_transformer(bad)


def test_static_scale_for_a_high_precision_destination_is_refused(exports, tmp_path):
    bad = rewrite(exports["cosmos"], tmp_path / "bad", lambda t: t.update({"proj_in.input_scale": torch.tensor(0.01)}))
    expected = "proj_in.input_scale: a static FP8 scale for proj_in, whose weight is BF16"
    with pytest.raises(CheckpointError, match=expected):
        load_transformer(bad)


@pytest.mark.parametrize("axis", ["tp_size", "ulysses_size", "cfg_size", "cp_size", "parallel_vae_size"])
def test_a_parallel_axis_above_1_is_refused_whatever_the_checkpoint(exports, axis):
    for checkpoint in (exports["cosmos"], exports["bf16"]):
        with pytest.raises(ConfigError, match=rf"cosmos3 runs a model on one GPU \(no parallel axis is built\); "
                                              rf"got parallel.{axis}=2 \(set it to 1\)"):
            load_transformer(checkpoint, parallel={axis: 2})
    load_transformer(exports["bf16"], parallel={axis: 1})


def test_from_pretrained_refuses_a_parallel_axis_before_it_reads_the_checkpoint(tmp_path):
    from cosmos3.pipeline import Cosmos3Pipeline

    with pytest.raises(ConfigError, match=r"parallel.tp_size: cosmos3 runs a model on one GPU"):
        Cosmos3Pipeline.from_pretrained(tmp_path, parallel={"tp_size": 2})  # an empty folder: nothing is read


@pytest.mark.parametrize("kwargs,message", [
    pytest.param({"precision": "fp8-dynamic"}, "forced dynamic quantization on a split GatedMLP", id="force-dynamic"),
    pytest.param({"precision": "bf16"}, "would re-quantize calibrated weights", id="force-bf16"),
])
def test_options_that_would_change_a_static_checkpoint_are_refused(exports, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        load_transformer(exports["cosmos"], **kwargs)


@pytest.mark.gpu
def test_static_fp8_on_cuda_scaled_mm_matches_cpu(exports):
    """torch._scaled_mm on the H200: as close to the BF16 model as the CPU path is (same bound).

    CPU and GPU accumulate in different orders, so an activation near an e4m3 rounding boundary
    can land one FP8 step (6%) apart and propagate; measured 3.4% RMS between them, far from the
    100%+ of a wrong scale.
    """
    ids, latents = sample(5)
    reference = load_transformer(exports["bf16"], dtype=torch.float32).velocity(ids, latents, 500.0, fps=24.0)
    cpu = load_transformer(exports["stock"], dtype=torch.bfloat16).velocity(ids, latents, 500.0, fps=24.0).float()
    gpu = load_transformer(exports["stock"], device="cuda", dtype=torch.bfloat16).velocity(
        ids.cuda(), latents.cuda(), 500.0, fps=24.0).cpu().float()
    assert relative_l2(gpu, cpu) < 0.1
    assert relative_l2(gpu, reference) < 0.15  # the CPU bound of test_static_fp8_velocity_is_close...


@pytest.mark.parametrize("accumulation", ["fast", "fp32"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("scale_shape", [(), (1,)], ids=["0-d", "one-element"])
def test_scaled_mm_is_the_product_of_its_e4m3_operands_times_both_scales(device, scale_shape, accumulation):
    """The CPU path is the exact product (fp32 accumulation of exact e4m3 values) either way; CUDA's FP8 tensor
    cores keep fewer bits while they accumulate (on the H200 the sum was off by 1.5e-4 of the sum of |terms|), so
    there the bound is 2^-10 of that sum: a wrong or missing scale errs by the whole product."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 5, 64, generator=g) * 40).clamp(-FP8_MAX, FP8_MAX).to(FP8)  # [..., K]
    w = (torch.randn(48, 64, generator=g) * 40).clamp(-FP8_MAX, FP8_MAX).to(FP8)  # [N, K]
    sa, sb = torch.tensor(0.0123).reshape(scale_shape), torch.tensor(0.0457).reshape(scale_shape)
    exact = torch.einsum("abk,nk->abn", x.double(), w.double()) * 0.0123 * 0.0457  # fp64: no rounding to speak of
    y = fp8_static.scaled_mm(x.to(device), w.to(device), sa.to(device), sb.to(device), torch.float32,
                             accumulation=accumulation).cpu()
    assert y.shape == (3, 5, 48) and y.dtype == torch.float32
    if device == "cpu":
        torch.testing.assert_close(y.double(), exact, rtol=2e-6, atol=1e-6)
    else:
        terms = torch.einsum("abk,nk->abn", x.double().abs(), w.double().abs()) * 0.0123 * 0.0457
        assert ((y.double() - exact).abs() <= 2.0**-10 * terms).all()


@pytest.mark.gpu
def test_fp32_accumulation_keeps_long_sums_closer_to_exact_than_fast_accumulation():
    """At Nano's longest K (the MLP's down projection, 12,288) the two accumulations differ as they should: "fp32"
    promotes partial sums and stays near the exact sum; "fast" drifts further (on Hopper), yet far inside the
    2^-4 relative step of the e4m3 operands themselves. Random e4m3 operands of activation-like spread."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(512, 12288, generator=g, device="cuda") * 40).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    w = (torch.randn(1024, 12288, generator=g, device="cuda") * 40).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    scale = torch.tensor(1.0, device="cuda")
    exact = x.double() @ w.double().t()
    error = {accumulation: relative_l2(fp8_static.scaled_mm(x, w, scale, scale, torch.float32,
                                                            accumulation=accumulation).double(), exact)
             for accumulation in ("fast", "fp32")}
    assert error["fp32"] < 2.0**-12, error
    assert error["fast"] < 2.0**-6, error
    if torch.cuda.get_device_capability() == (9, 0):  # Hopper's FP8 MMA accumulator keeps fewer bits
        assert error["fast"] > 3 * error["fp32"], error
