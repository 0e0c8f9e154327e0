"""The benchmark's random checkpoint writer at tiny size: the published layout, loaded strictly, FP8 kept bit
for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from benchmarks.random_checkpoint import INPUT_AMAX, PUBLISHED_IGNORE, write_checkpoint
from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY
from cosmos3.layers.linear import Linear
from cosmos3.pipeline import Cosmos3Pipeline
from tests.tiny_checkpoint import TINY_TRANSFORMER, TINY_VAE, Z_DIM

# The Nano head set (sound and action too), at tiny width; layers 2 -> 28 decoder projections.
TINY = {**TINY_TRANSFORMER, "sound_gen": True, "sound_dim": 4, "action_gen": True, "action_dim": 4}
# Super's shape at tiny width: query width above hidden, groups of 8, intermediate 5x hidden (docs/models.md).
TINY_SUPER = {**TINY, "hidden_size": 40, "num_attention_heads": 8, "num_key_value_heads": 1, "intermediate_size": 200}
SHAPES = {"nano": TINY, "super": TINY_SUPER}
VAE = {**TINY_VAE, "latents_mean": [0.1] * Z_DIM, "latents_std": [0.9] * Z_DIM}
PROJECTIONS = ["self_attn.to_q", "self_attn.to_k", "self_attn.to_v", "self_attn.to_out", "self_attn.add_q_proj",
               "self_attn.add_k_proj", "self_attn.add_v_proj", "self_attn.to_add_out", "mlp.gate_proj", "mlp.up_proj",
               "mlp.down_proj", "mlp_moe_gen.gate_proj", "mlp_moe_gen.up_proj", "mlp_moe_gen.down_proj"]


@pytest.fixture(scope="module", params=list(SHAPES))
def roots(request, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp(f"random-{request.param}")
    # Small shards: several files, so the index is what places each tensor.
    return {v: write_checkpoint(base / v, variant=v, transformer=SHAPES[request.param], vae=VAE, shard_bytes=30_000)
            and base / v for v in ("fp8", "bf16")}


def stored(root: Path) -> dict[str, torch.Tensor]:
    index = json.loads((root / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(root / "transformer" / shard, framework="pt") as f:
            tensors.update({key: f.get_tensor(key) for key in f.keys()})
    assert set(tensors) == set(index["weight_map"])
    return tensors


def test_fp8_variant_is_what_modelopt_0_47_exports(roots):
    config = json.loads((roots["fp8"] / "transformer" / "config.json").read_text())
    assert config["quantization_config"] == {
        "config_groups": {"group_0": {
            "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
            "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
            "targets": ["Linear"]}},
        "ignore": PUBLISHED_IGNORE, "quant_algo": "FP8", "producer": {"name": "modelopt", "version": "0.47.0"},
        "quant_method": "modelopt", "runtime": {"diffusion_step_policy": PUBLISHED_STEP_POLICY},
    }
    hf_quant = json.loads((roots["fp8"] / "hf_quant_config.json").read_text())
    assert hf_quant == {k: v for k, v in config["quantization_config"].items() if k != "runtime"}
    tensors = stored(roots["fp8"])
    assert not [k for k in tensors if "_quantizer." in k]  # 0.47 writes no _amax buffers
    fp8 = sorted(k for k, t in tensors.items() if t.dtype == torch.float8_e4m3fn)
    assert fp8 == sorted(f"layers.{i}.{p}.weight" for i in range(2) for p in PROJECTIONS)  # both towers, nothing else
    for key in fp8:
        module = key.removesuffix(".weight")
        for scale in ("weight_scale", "input_scale"):
            assert tensors[f"{module}.{scale}"].dtype == torch.float32 and tensors[f"{module}.{scale}"].shape == ()
        # weight_scale = amax / 448: the largest weight sits on e4m3's largest finite value
        assert tensors[key].float().abs().max() == 448.0
        assert tensors[f"{module}.input_scale"] == torch.tensor(INPUT_AMAX / 448.0)
    assert tensors["embed_tokens.weight"].dtype == torch.bfloat16 and tensors["proj_in.weight"].dtype == torch.bfloat16
    assert tensors["time_embedder.linear_1.weight"].dtype == torch.float32  # diffusers keeps it fp32


def test_fp8_checkpoint_loads_strictly_and_its_fp8_tensors_round_trip_bit_for_bit(roots):
    pipe = Cosmos3Pipeline.from_pretrained(roots["fp8"])  # strict: any missing or unexpected key raises
    assert pipe.model.precision == "fp8-static" and pipe.model.step_policy_info() is not None
    tensors = stored(roots["fp8"])
    loaded = 0
    for name, linear in pipe.model.named_modules():
        if isinstance(linear, Linear) and linear.weight.dtype == torch.float8_e4m3fn:
            for suffix in ("weight", "weight_scale", "input_scale"):
                ours, theirs = getattr(linear, suffix), tensors[f"{name}.{suffix}"]
                assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
                assert torch.equal(ours.reshape(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))
            loaded += 1
    assert loaded == 2 * len(PROJECTIONS)


def test_bf16_variant_is_the_same_model_dequantized_and_loads_into_diffusers_strictly(roots):
    from diffusers import Cosmos3OmniTransformer

    fp8, bf16 = stored(roots["fp8"]), stored(roots["bf16"])
    for key, weight in fp8.items():
        if weight.dtype == torch.float8_e4m3fn:
            scale = fp8[key.replace(".weight", ".weight_scale")]
            assert torch.equal(bf16[key], (weight.float() * scale).to(torch.bfloat16))
        elif not key.endswith("_scale"):
            assert torch.equal(bf16[key], weight)  # every other tensor is the same draw
    config = json.loads((roots["bf16"] / "transformer" / "config.json").read_text())
    model = Cosmos3OmniTransformer.from_config(config)
    model.load_state_dict(bf16, strict=True)  # diffusers' own names, no key left over or missing
    assert Cosmos3Pipeline.from_pretrained(roots["bf16"]).model.precision == "bf16"


def test_the_benchmark_manifest_validates_against_its_checkpoint(roots, tmp_path):
    """bench_render's manifest (the Nano workload, the second and third stills included, then a stream of stills)
    is one `farm validate` accepts."""
    from benchmarks.bench_render import JOBS, PROMPT, stream_jobs, workload_jobs, write_manifest
    from farm import manifest

    names = [name for name in JOBS if "4step" not in name]  # the distilled builds' jobs: test_builds.py
    path = write_manifest(tmp_path / "run", roots["fp8"], "fp8", workload_jobs(names) + stream_jobs(10, 4))
    loaded = manifest.load(path)
    jobs = {job.key: job for job in loaded.jobs}
    assert set(jobs) == set(names) | {f"still-{i:03d}" for i in range(10)}
    stills = [jobs[key].request for key in ("t2i", "t2i-seed2", "t2i-seed3")]
    assert all(still.prompt == PROMPT for still in stills)
    assert all((still.width, still.height, still.steps) == (1024, 1024, 50) for still in stills)
    assert [still.seed for still in stills] == [0, 2, 3]

    # The stream: 4 prompts in passes of 4 (10 stills), a prompt's seed counting its passes; after the workload's jobs.
    stream = [job.request for job in loaded.jobs if job.key.startswith("still-")]
    assert len({still.prompt for still in stream[:4]}) == 4 and len({still.prompt for still in stream}) == 4
    assert [still.seed for still in stream] == [1] * 4 + [2] * 4 + [3] * 2
    assert all((still.width, still.height, still.steps) == (1024, 1024, 50) for still in stream)
    assert max(job.priority for job in loaded.jobs if job.key.startswith("still-")) < jobs["t2i-seed3"].priority
