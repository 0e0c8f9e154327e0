"""Step precision: strict policy parsing, step selection, W8A16 dispatch and transformer wiring."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

import cosmos3.quant.fp8_static as fp8_static
import cosmos3.quant.w8a16 as w8a16
from cosmos3 import load_transformer
from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY
from cosmos3.errors import ConfigError
from cosmos3.quant import STATIC_FP8, W8A16
from cosmos3.rules.config import QuantConfig
from cosmos3.rules.step_precision import StepPolicy, parse_runtime, resolve_policy
from testbed.fp8_checkpoints import PROMPTS, make_bf16, make_fp8

PUBLISHED = {"diffusion_step_policy": PUBLISHED_STEP_POLICY}


def with_policy(**changes):
    policy = copy.deepcopy(PUBLISHED_STEP_POLICY)
    for key, value in changes.items():
        if value is ...:
            del policy[key]
        else:
            policy[key] = value
    return {"diffusion_step_policy": policy}


# ---------------------------------------------------------------- parsing

def test_published_policy_is_accepted():
    assert parse_runtime(PUBLISHED) == StepPolicy(first=3, last=3, reasoner="a16", source="checkpoint")


@pytest.mark.parametrize("runtime", [pytest.param(None, id="null")])
def test_null_runtime_means_no_policy(runtime):
    assert parse_runtime(runtime) is None
    assert resolve_policy(QuantConfig.from_dict({"quant_method": "modelopt"})) is None  # runtime absent


BAD = [
    *[pytest.param(with_policy(**{f: ...}), f"missing field\\(s\\) \\['{f}'\\]", id=f"missing-{f}")
      for f in PUBLISHED_STEP_POLICY],
    pytest.param(with_policy(extra=1), r"unknown field\(s\) \['extra'\]", id="unknown-field"),
    pytest.param(with_policy(schema_version=2), "schema_version: only the integer 1", id="schema-2"),
    pytest.param(with_policy(schema_version=True), "schema_version: only the integer 1", id="schema-bool"),
    pytest.param(with_policy(schema_version="1"), "schema_version: only the integer 1", id="schema-str"),
    pytest.param(with_policy(type="first_n"), r"type: only 'first_last_n'", id="type"),
    pytest.param(with_policy(index_space="timestep"), "index_space: only 'denoising_loop_iteration'", id="index"),
    pytest.param(with_policy(default_mode="a16"), "default_mode: only 'native'", id="default-mode"),
    pytest.param(with_policy(overlap="native"), "overlap: only 'a16'", id="overlap"),
    pytest.param(with_policy(reasoner="fp8"), "reasoner: must be 'a16' or 'native'", id="reasoner"),
    pytest.param(with_policy(scope=["vae"]), "scope: must be a list of strings containing 'transformer'", id="scope"),
    pytest.param(with_policy(scope="transformer"), "scope: must be a list", id="scope-str"),
    pytest.param(with_policy(first_steps={"count": 3}), r"first_steps: must be exactly \{count, mode\}", id="win-keys"),
    pytest.param(with_policy(first_steps={"count": 3, "mode": "native"}), "first_steps.mode: only 'a16'",
                 id="win-mode"),
    pytest.param(with_policy(last_steps={"count": -1, "mode": "a16"}), "last_steps.count: must be an integer >= 0",
                 id="count-negative"),
    pytest.param(with_policy(last_steps={"count": True, "mode": "a16"}), "last_steps.count: must be an integer",
                 id="count-bool"),
    pytest.param(with_policy(last_steps={"count": 2.0, "mode": "a16"}), "last_steps.count: must be an integer",
                 id="count-float"),
    pytest.param({"diffusion_step_policy": PUBLISHED_STEP_POLICY, "other": 1}, r"runtime: unknown field",
                 id="runtime-unknown"),
    pytest.param({}, "diffusion_step_policy: missing", id="runtime-empty"),
    pytest.param(["a16"], "runtime must be a mapping or null", id="runtime-list"),
]


@pytest.mark.parametrize("runtime,message", BAD)
def test_policies_we_do_not_fully_understand_are_refused_by_field(runtime, message):
    with pytest.raises(ConfigError, match=message):
        parse_runtime(runtime)


# ---------------------------------------------------------------- selection

@pytest.mark.parametrize("first,last,n,expected", [
    pytest.param(3, 3, 1, [], id="n1-warmup-carve-out"),
    pytest.param(3, 3, 4, [0, 1, 2, 3], id="n4"),
    pytest.param(3, 3, 6, [0, 1, 2, 3, 4, 5], id="n6"),
    pytest.param(3, 3, 35, [0, 1, 2, 32, 33, 34], id="n35"),
    pytest.param(3, 3, 50, [0, 1, 2, 47, 48, 49], id="n50"),
    pytest.param(0, 0, 35, [], id="counts-0"),
    pytest.param(0, 3, 35, [32, 33, 34], id="first-0"),
    pytest.param(2, 0, 50, [0, 1], id="last-0"),
])
def test_step_selection(first, last, n, expected):
    policy = StepPolicy(first, last, "a16", "checkpoint")
    assert policy.a16_steps(n) == expected
    assert [policy.is_high_precision(i, n) for i in range(n)] == [i in expected for i in range(n)]


def test_override_and_off():
    quant = QuantConfig.from_dict({"quant_method": "modelopt", "runtime": PUBLISHED})
    assert resolve_policy(quant, "off") is None
    assert resolve_policy(quant, {"first": 1, "last": 0}) == StepPolicy(1, 0, "a16", "override")
    with pytest.raises(ConfigError, match=r"an override must be \{first, last\[, reasoner\]\}"):
        resolve_policy(quant, {"first": 1})


# ---------------------------------------------------------------- dispatch and wiring

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("steps")
    bf16 = make_bf16(root / "bf16")
    policy = dict(PUBLISHED_STEP_POLICY, reasoner="native")
    return bf16, make_fp8(bf16, root / "fp8", step_policy=policy)


def sample(seed=0):
    g = torch.Generator().manual_seed(seed)
    return PROMPTS[1], torch.randn(4, 2, 4, 4, generator=g)


def test_w8a16_linear_is_the_dequantized_weight_in_a_16bit_gemm(ckpts):
    _, fp8 = ckpts
    linear = load_transformer(fp8, dtype=torch.bfloat16).layers[0].mlp_moe_gen.up_proj
    linear.quant_method = W8A16
    x = torch.randn(5, 64).bfloat16()
    expected = F.linear(x, linear.weight.to(torch.bfloat16) * linear.weight_scale)
    assert torch.equal(linear(x), expected)
    with pytest.raises(TypeError, match="already-quantized FP8 activation"):
        linear(STATIC_FP8.quantize_input(linear, x))


@pytest.mark.gpu
def test_w8a16_on_cuda_dequantizes_with_our_op_bit_identically(ckpts, monkeypatch):
    _, fp8 = ckpts
    model = load_transformer(fp8, device="cuda", dtype=torch.bfloat16)
    calls = []
    real = w8a16.ops.dequantize_fp8
    monkeypatch.setattr(w8a16.ops, "dequantize_fp8", lambda w, s, dtype: calls.append(1) or real(w, s, dtype))
    for linear in (model.layers[0].mlp_moe_gen.up_proj, model.layers[1].mlp_moe_gen.down_proj):
        linear.quant_method = W8A16
        x = torch.randn(7, linear.in_features, device="cuda").bfloat16()
        # CUDA's eager `W.to(bf16) * scale` rounds the scale to bf16 first; we round once (as on the CPU).
        expected = F.linear(x, (linear.weight.float() * linear.weight_scale).to(torch.bfloat16))
        assert torch.equal(linear(x), expected)
    assert len(calls) == 2


def capture_inputs(model, monkeypatch):
    """Record what GEN layer 0's Q/K/V and down_proj receive, and count quantizations."""
    seen, calls = {}, []
    real = fp8_static.ops.quantize_fp8
    monkeypatch.setattr(fp8_static.ops, "quantize_fp8", lambda x, s: calls.append(1) or real(x, s))
    layer = model.layers[0]
    for name, module in (("q", layer.self_attn.add_q_proj), ("k", layer.self_attn.add_k_proj),
                         ("v", layer.self_attn.add_v_proj), ("down", layer.mlp_moe_gen.down_proj)):
        module.register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name, a[0]))
    return seen, calls


def test_sharing_sites_engage_on_w8a8_steps_and_stand_down_on_w8a16_steps(ckpts, monkeypatch):
    _, fp8 = ckpts
    model = load_transformer(fp8, dtype=torch.bfloat16)
    ids, latents = sample()
    cache = model.encode_text(ids)
    seen, calls = capture_inputs(model, monkeypatch)

    model.set_denoising_step(10, 35)  # middle step: W8A8
    native = model.velocity(ids, latents, 500.0, und_cache=cache)
    assert len({seen[x].data_ptr() for x in "qkv"}) == 1 and seen["q"].dtype == torch.float8_e4m3fn
    assert seen["down"].dtype == torch.float8_e4m3fn  # swiglu emitted FP8 straight for down_proj
    assert len(calls) > 0

    calls.clear()
    model.set_denoising_step(0, 35)  # edge step: W8A16
    high = model.velocity(ids, latents, 500.0, und_cache=cache)
    assert all(seen[x].dtype == torch.bfloat16 for x in ("q", "k", "v", "down"))
    assert calls == []  # nothing on the GEN path quantized an activation
    assert not torch.equal(native, high)


def test_16bit_step_lands_closer_to_the_bf16_reference(ckpts):
    bf16, fp8 = ckpts
    ids, latents = sample(2)
    reference = load_transformer(bf16, dtype=torch.float32).velocity(ids, latents, 800.0, fps=24.0)
    model = load_transformer(fp8, dtype=torch.float32)
    cache = model.encode_text(ids)
    errors = {}
    for step in (0, 17):
        model.set_denoising_step(step, 35)
        v = model.velocity(ids, latents, 800.0, fps=24.0, und_cache=cache)
        errors[step] = ((v - reference).norm() / reference.norm()).item()
    assert errors[0] < errors[17], errors


def test_transformer_reads_the_policy_from_the_checkpoint_config(ckpts):
    """Fails if the loader reads another key: step 0 would then run W8A8 like 'off'."""
    _, fp8 = ckpts
    assert json.loads((fp8 / "config.json").read_text())["quantization_config"]["runtime"]
    ids, latents = sample(1)
    on = load_transformer(fp8, dtype=torch.float32)
    off = load_transformer(fp8, dtype=torch.float32, step_precision="off")
    assert on.step_policy_info()["source"] == "checkpoint" and off.step_policy_info() is None
    results = {}
    for step in (0, 10, 34):
        for name, model in (("on", on), ("off", off)):
            model.set_denoising_step(step, 35)
            results[name, step] = model.velocity(ids, latents, 500.0)
    assert not torch.equal(results["on", 0], results["off", 0])
    assert not torch.equal(results["on", 34], results["off", 34])
    assert torch.equal(results["on", 10], results["off", 10])


def test_und_tower_is_not_step_gated(ckpts):
    """reasoner=native: the UND cache is the same whichever step selected it; a16: always W8A16."""
    _, fp8 = ckpts
    ids, _ = sample()
    model = load_transformer(fp8, dtype=torch.float32)
    model.set_denoising_step(0, 35)
    at_edge = model.encode_text(ids)
    model.set_denoising_step(10, 35)
    in_middle = model.encode_text(ids)
    assert all(torch.equal(a, b) for a, b in zip(at_edge.keys, in_middle.keys, strict=True))
    off = load_transformer(fp8, dtype=torch.float32, step_precision="off").encode_text(ids)
    assert all(torch.equal(a, b) for a, b in zip(at_edge.keys, off.keys, strict=True))  # native == fully quantized

    a16 = load_transformer(fp8, dtype=torch.float32, step_precision={"first": 3, "last": 3, "reasoner": "a16"})
    a16.set_denoising_step(10, 35)
    a16_cache = a16.encode_text(ids)
    assert not any(torch.equal(a, b) for a, b in zip(a16_cache.keys[1:], off.keys[1:], strict=True))
    und_linears = [a16.layers[0].self_attn.to_q, a16.layers[1].mlp.down_proj]
    assert all(linear.quant_method is W8A16 for linear in und_linears)


def test_dequantized_weights_are_what_w8a16_would_dequantize_per_call(ckpts):
    _, fp8 = ckpts
    model = load_transformer(fp8, dtype=torch.bfloat16)
    layer = model.layers[0].mlp_moe_gen
    linears = [layer.up_proj, layer.down_proj]
    model.step_precision.a16 = True  # a W8A16 step: the GEN linears compute with W8A16
    assert all(linear.method is W8A16 for linear in linears)
    xs = [torch.randn(5, linear.in_features).bfloat16() for linear in linears]
    per_call = [linear(x) for linear, x in zip(linears, xs, strict=True)]
    held = w8a16.DequantizedWeights(model.step_precision, linears, torch.bfloat16)
    assert all(linear.dequantized.dtype == torch.bfloat16 for linear in linears)
    assert held.nbytes(linears, torch.bfloat16) == sum(linear.weight.numel() * 2 for linear in linears)
    for linear, x, expected in zip(linears, xs, per_call, strict=True):
        assert torch.equal(linear(x), expected)
        linear.dequantized.zero_()  # proves the held copy is what the GEMM reads
        assert torch.equal(linear(x), torch.zeros_like(expected))
        # An activation of another dtype than the held copy's dequantizes per call.
        assert torch.equal(linear(x.float()), F.linear(x.float(), w8a16.dequantize(linear, torch.float32)))
    held.release()
    assert all(linear.dequantized is None for linear in linears)
    assert all(torch.equal(linear(x), e) for linear, x, e in zip(linears, xs, per_call, strict=True))
