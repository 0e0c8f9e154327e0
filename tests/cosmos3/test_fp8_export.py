"""cosmos3.checkpoint.fp8_export: ModelOpt calibrated on our pipeline's real renders, its export loaded and rendered."""

from __future__ import annotations

import json

import pytest

from cosmos3 import load_transformer
from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY, export_fp8, main
from cosmos3.diffusers_model import DiffusersVelocity, load_diffusers_transformer
from cosmos3.ops import FP8_MAX
from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest
from cosmos3.quant.fp8_static import StaticFP8LinearMethod
from cosmos3.quant.unquantized import UnquantizedLinearMethod
from cosmos3.rules.config import Cosmos3Config
from tests.tiny_checkpoint import make_tiny_checkpoint

PROMPT = "a red robot walks through a city at night"
CALIBRATION = [RenderRequest(task="t2v", prompt=PROMPT, width=48, height=32, frames=9, steps=2, seed=3),
               RenderRequest(task="t2i", prompt="a blue cat", width=32, height=32, steps=2, seed=4)]
PROBED = ("layers.0.self_attn.add_q_proj", "layers.1.mlp_moe_gen.down_proj", "layers.0.self_attn.to_q")


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("src") / "bf16")


@pytest.fixture(scope="module")
def exported(bf16, tmp_path_factory):
    return export_fp8(bf16, tmp_path_factory.mktemp("dst") / "fp8", CALIBRATION, max_shard_size="64KB")


def test_input_scales_are_the_max_of_our_pipelines_renders(bf16, exported):
    """The calibration loop is ours: each input_scale is max|input| / 448 over the very renders asked for
    (both CFG branches, every step), seen here by hooks on diffusers' model driven the same way."""
    model = load_diffusers_transformer(bf16 / "transformer")
    seen: dict[str, float] = {}
    for name in PROBED:
        def record(module, args, name=name):
            seen[name] = max(seen.get(name, 0.0), args[0].abs().amax().float().item())
        model.get_submodule(name).register_forward_pre_hook(record)
    velocity = DiffusersVelocity(model, Cosmos3Config.from_json(bf16 / "transformer" / "config.json"))
    pipe = Cosmos3Pipeline.from_pretrained(bf16, model=velocity, cache="off")  # as the export calibrates
    for request in CALIBRATION:
        pipe(request)
    state = load_transformer(exported).state_dict()
    for name in PROBED:
        assert state[f"{name}.input_scale"].item() == pytest.approx(seen[name] / FP8_MAX, rel=1e-6), name


def test_the_export_renders_with_the_published_step_policy(bf16, exported):
    config = json.loads((exported / "transformer" / "config.json").read_text())
    assert config["quantization_config"]["runtime"] == {"diffusion_step_policy": PUBLISHED_STEP_POLICY}
    assert config["quantization_config"]["producer"]["name"] == "modelopt"
    for component in ("model_index.json", "vae", "scheduler", "text_tokenizer"):
        assert (exported / component).exists(), component
    pipe = Cosmos3Pipeline.from_pretrained(exported)
    out = pipe(CALIBRATION[0])
    assert out.frames.shape == (9, 32, 48, 3)
    assert out.info["precision"] == "fp8-static" and out.info["step_policy"]["a16_steps"] == [0, 1]
    assert type(pipe.model.proj_in.quant_method) is UnquantizedLinearMethod  # the cosmos recipe


def test_the_command_line_stock_recipe_quantizes_proj_in(bf16, tmp_path):
    dst = tmp_path / "stock"
    main([str(bf16), str(dst), "--recipe", "stock", "--task", "t2i", "--width", "32", "--height", "32",
          "--steps", "1", "--step-policy", "none"])
    model = load_transformer(dst)
    assert type(model.proj_in.quant_method) is StaticFP8LinearMethod
    assert model.step_controller is None  # --step-policy none: every step native W8A8
    assert "runtime" not in json.loads((dst / "transformer" / "config.json").read_text())["quantization_config"]


def test_an_existing_destination_is_refused(bf16, exported):
    with pytest.raises(FileExistsError, match="transformer exists; remove it"):
        export_fp8(bf16, exported, CALIBRATION)


def test_recipes_are_named(bf16, tmp_path):
    with pytest.raises(ValueError, match="recipe='fast'; expected one of \\['cosmos', 'stock'\\]"):
        export_fp8(bf16, tmp_path / "x", CALIBRATION[1:], recipe="fast")
