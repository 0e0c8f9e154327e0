"""cosmos3.rules.memory_plan: resident bytes from the headers, and the activation model against the figures measured on
the H200 (benchmarks/results/h200-step-cache.md, h200-render.md) and the H100 (h100-render.md, h100-super.md)."""

from __future__ import annotations

import pytest
from safetensors import safe_open

from cosmos3.rules.checkpoint_header import SKIPPED
from cosmos3.rules.memory_plan import DEVICE_OVERHEAD, GIB, ModelMemory, plan_job
from tests.tiny_checkpoint import make_tiny_checkpoint

# The full-size models as benchmarks/random_checkpoint.py writes them (bytes of transformer/, the Wan 2.2 VAE's
# 704,688,668 parameters in BF16): Nano's measured on the H200, Super's written by the same code.
VAE = 704_688_668 * 2
NANO = ModelMemory(16_491_475_392, VAE, 0, 4096, 12288, 36, 8 * 128, 2, 16, 4)
SUPER = ModelMemory(65_683_308_032, VAE, 0, 5120, 25600, 64, 8 * 128, 2, 16, 4)
CLIP = {"width": 1280, "height": 720, "frames": 189, "text_tokens": 300}


def test_resident_bytes_are_the_tensors_the_loader_keeps(tmp_path):
    root = make_tiny_checkpoint(tmp_path / "c", sound=True)
    stored = 0
    for shard in (root / "transformer").glob("*.safetensors"):
        with safe_open(shard, framework="pt") as f:
            stored += sum(f.get_tensor(k).nbytes for k in f.keys() if k not in SKIPPED)
    model = ModelMemory.from_checkpoint(root)
    assert model.weights == stored
    with safe_open(root / "vae" / "diffusion_pytorch_model.safetensors", framework="pt") as f:
        assert model.vae == sum(f.get_tensor(k).numel() * 2 for k in f.keys())  # decoded in BF16
    with safe_open(root / "sound_tokenizer" / "diffusion_pytorch_model.safetensors", framework="pt") as f:
        assert model.sound == sum(f.get_tensor(k).nbytes for k in f.keys())
    assert (model.hidden, model.layers, model.spatial, model.temporal) == (32, 2, 16, 4)


def test_the_nano_clip_steps_plan_what_the_h200_allocated_uncached():
    """20.67 GiB allocated in the uncached clip's steps on the H200 (the model's 16.67 GiB resident then)."""
    job = plan_job(NANO, **CLIP, cached=False)
    assert job.gen_tokens == 48 * 23 * 40
    assert (NANO.resident + job.steps) / GIB == pytest.approx(20.67, rel=0.02)


@pytest.mark.parametrize("model, measured", [(NANO, 23.37 - 15.52), (SUPER, 73.85 - 61.48)], ids=["nano", "super"])
def test_the_cached_clip_steps_plan_what_the_h100_allocated(model, measured):
    """The cached clip through the farm on the H100: peak allocated during the steps minus the GPU memory resident at
    the job's start (h100-render.md: 23.37 - 15.52 GiB; h100-super.md: 73.85 - 61.48 GiB), within 5%."""
    steps = plan_job(model, **CLIP, cached=True).steps / GIB
    assert steps == pytest.approx(measured, rel=0.05)


def test_the_nano_clip_decode_plans_what_the_h200_allocated():
    """An untiled BF16 decode of the clip peaked 11.1 GiB above the resident model; the plan rounds up."""
    job = plan_job(NANO, **CLIP, cached=True)
    assert job.decode / GIB == pytest.approx(11.1, rel=0.12) and job.decode / GIB >= 11.1
    assert job.peak == NANO.resident + job.decode and job.need == job.peak + DEVICE_OVERHEAD
    assert not job.tiled


def test_super_plans_its_widths_and_tiles_where_the_untiled_decode_does_not_fit():
    clip = plan_job(SUPER, **CLIP, cached=True)
    nano = plan_job(NANO, **CLIP, cached=True)
    # Per token, Super's MLP and hidden widths: 193,280 bytes against Nano's 97,280.
    assert clip.steps - nano.steps > clip.gen_tokens * (193_280 - 97_280)
    h100 = 79 * GIB
    on_h100 = plan_job(SUPER, **CLIP, cached=True, gpu_memory=h100)
    roomy = plan_job(SUPER, **CLIP, cached=True, gpu_memory=140 * GIB)
    assert not roomy.tiled and roomy.decode == clip.decode
    assert on_h100.tiled == (SUPER.resident + clip.decode + DEVICE_OVERHEAD > h100)
    least = plan_job(SUPER, **CLIP, cached=True, gpu_memory=0)
    # Super's cached clip steps need more than its untiled decode: tiling lowers the decode, not the job's need.
    assert clip.steps > clip.decode
    assert least.tiled and least.decode < clip.decode and least.need == clip.need


def test_a_still_is_planned_from_its_own_tokens():
    still = plan_job(SUPER, width=1024, height=1024, frames=1, text_tokens=300, cached=False)
    assert still.gen_tokens == 32 * 32
    assert still.peak - SUPER.resident < 1 * GIB
    assert "at 1,024 tokens a pass" in still.describe()
