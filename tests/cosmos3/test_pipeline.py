"""The render pipeline end to end on a tiny random checkpoint (CPU, fp32), plus its parts.

Every task renders; same seed -> same frames; conditioned frames come back as the VAE's own round
trip of the input; the CFG protocol (step precision first, then two passes with their own UND
caches; guidance interval; a static-FP8 step policy) is observed on the real model; prompts and
T2V frames match diffusers' published ``Cosmos3OmniPipeline``; bad requests fail with a message
naming the field and the fix; a VAE built in the background is waited for by the first job only,
a ``vae/`` broken visibly fails ``from_pretrained`` in either load mode, and one only diffusers can see
fails every job.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3 import pipeline
from cosmos3.errors import CheckpointError, ConfigError, PipelineError, VAELoadError
from cosmos3.library_import import LIBRARY_IMPORT
from cosmos3.media import load_image, load_video, resize_cover_crop, to_uint8_frames
from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest
from cosmos3.prompt_tokenizer import PromptTokenizer
from cosmos3.rules.checkpoint_header import DIFFUSERS_WEIGHTS as WEIGHTS
from cosmos3.rules.checkpoint_identity import fingerprint
from cosmos3.rules.prompt import PromptSpec
from cosmos3.vae import VAEBuild, WanVAE
from tests.tiny_checkpoint import DISTILLED_SCHEDULER, make_tiny_checkpoint, mismatch_weights

STEPS = 3
PROMPT = "A red robot walks through a city at night"
# task -> the smallest job that exercises it: (width, height, frames)
JOBS = {
    "t2v": (48, 32, 9),
    "t2i": (32, 32, 1),
    "i2v": (32, 32, 9),
    "v2v": (32, 32, 13),
}
# uint8 levels: fp32 arithmetic differs only in rounding, which can flip one level.
ROUND_TRIP_TOLERANCE = 1


def rng_pixels(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def job(task: str, **fields) -> RenderRequest:
    width, height, frames = JOBS[task]
    inputs = {
        "i2v": {"image": rng_pixels((height, width, 3))},
        "v2v": {"video": rng_pixels((7, height, width, 3))},
    }.get(task, {})
    return RenderRequest(
        **{"task": task, "prompt": PROMPT, "width": width, "height": height, "frames": frames, "steps": STEPS,
           **inputs, **fields}
    )


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """diffusers VAE output ``[1, 3, T, H, W]`` in [-1, 1] -> ``uint8 [T, H, W, 3]``."""
    return ((video[0] / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()


def vae_round_trip(pipe: Cosmos3Pipeline, frames: np.ndarray) -> np.ndarray:
    """The diffusers VAE's own encode (posterior mode) -> decode of ``uint8 [T, H, W, 3]``."""
    x = torch.from_numpy(frames).permute(3, 0, 1, 2).float() / 127.5 - 1.0  # [3, T, H, W]
    with torch.no_grad():
        mu = pipe.vae.vae.encode(x[None]).latent_dist.mode()
        return to_uint8(pipe.vae.vae.decode(mu).sample)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def pipe(root):
    return Cosmos3Pipeline.from_pretrained(root, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def distilled_pipe(tmp_path_factory):
    root = make_tiny_checkpoint(tmp_path_factory.mktemp("distilled"), scheduler=DISTILLED_SCHEDULER)
    return Cosmos3Pipeline.from_pretrained(root, device="cpu", dtype=torch.float32)


class ModelSpy:
    """Records, in order, the model calls of a render: prepare_gen, encode_text, set_denoising_step, forward
    ("velocity")."""

    def __init__(self, model, monkeypatch):
        self.events: list[dict] = []
        self.caches: dict[int, list[int]] = {}  # id(cache) -> the token ids it was built from
        encode_text, forward, set_step = model.encode_text, model.forward, model.set_denoising_step
        prepare_gen = model.prepare_gen

        def spy_prepare_gen(latent_shape, sound_frames):
            self.events.append({"call": "prepare_gen", "shape": tuple(latent_shape), "sound_frames": sound_frames})
            prepare_gen(latent_shape, sound_frames)

        def spy_encode_text(input_ids):
            cache = encode_text(input_ids)
            self.caches[id(cache)] = input_ids.tolist()
            self.events.append({"call": "encode_text"})
            return cache

        def spy_forward(input_ids, latents, timestep, **kwargs):
            sound = kwargs.get("sound_latents")
            self.events.append(
                {"call": "velocity", "ids": input_ids.tolist(), "cache": id(kwargs["und_cache"]), "t": timestep,
                 "latents": latents.clone(), "condition_frames": tuple(kwargs["condition_frames"]),
                 "fps": kwargs["fps"], "sound": None if sound is None else sound.clone()}
            )
            return forward(input_ids, latents, timestep, **kwargs)

        def spy_set_step(step, num_steps):
            self.events.append({"call": "step", "step": step, "num_steps": num_steps})
            set_step(step, num_steps)

        monkeypatch.setattr(model, "encode_text", spy_encode_text)
        monkeypatch.setattr(model, "forward", spy_forward)
        monkeypatch.setattr(model, "set_denoising_step", spy_set_step)
        monkeypatch.setattr(model, "prepare_gen", spy_prepare_gen)

    def of(self, call: str) -> list[dict]:
        return [e for e in self.events if e["call"] == call]


class StopRender(Exception):
    """Raised from a patched model call to end a render early."""


# -- every task end to end ----------------------------------------------------------------------


@pytest.mark.parametrize("task", list(JOBS))
def test_every_task_renders_uint8_frames_of_the_requested_size(pipe, task):
    width, height, frames = JOBS[task]
    progress = []
    out = pipe(job(task), callback=lambda i, n: progress.append((i, n)))
    assert out.frames.shape == (frames, height, width, 3)
    assert out.frames.dtype == np.uint8
    assert isinstance(out.fps, float) and out.fps == 24.0
    assert progress == [(i, STEPS) for i in range(STEPS)]
    assert set(out.timings) == {"vae_wait", "tokenize", "vae_encode", "und", "steps", "vae_decode", "total"}
    assert out.timings["vae_wait"] == 0.0  # loaded eagerly: built before from_pretrained returned
    assert len(out.timings["steps"]) == STEPS
    assert all(v >= 0 for v in [*out.timings["steps"], out.timings["tokenize"], out.timings["und"]])
    assert (out.timings["vae_encode"] is None) is (task in ("t2v", "t2i"))  # only i2v / v2v encode frames
    stages = sum(out.timings["steps"]) + out.timings["vae_decode"] + (out.timings["vae_encode"] or 0)
    assert out.timings["total"] >= stages
    assert out.memory["peak_allocated_bytes"] is None and out.memory["resident_bytes"] is None  # CPU
    assert out.info["task"] == task and out.info["seed"] == 0
    assert out.info["scheduler"] == "UniPCMultistepScheduler"
    assert out.info["flow_shift"] == (3.0 if task == "t2i" else 10.0)
    assert out.info["precision"] == "bf16" and out.info["step_policy"] is None and out.info["fp8_accumulation"] is None


@pytest.mark.parametrize(
    "task,shape,fps,steps",
    [
        # 189 frames -> 48 latent frames; 720x1280 and 1024x1024 over the spatial factor 16.
        pytest.param("t2v", (8, 48, 45, 80), 24.0, 35, id="t2v"),
        pytest.param("t2i", (8, 1, 64, 64), None, 50, id="t2i"),
    ],
)
def test_unset_fields_take_the_task_defaults(pipe, monkeypatch, task, shape, fps, steps):
    # The defaults are too big for a CPU test: stop at the first velocity and read the job there.
    def stop(input_ids, latents, timestep, **kwargs):
        raise StopRender(tuple(latents.shape), kwargs["fps"])

    num_steps = []
    monkeypatch.setattr(pipe.model, "forward", stop)
    monkeypatch.setattr(pipe.model, "set_denoising_step", lambda step, n: num_steps.append(n))
    with pytest.raises(StopRender) as stopped:
        pipe(RenderRequest(task=task, prompt=PROMPT))
    assert stopped.value.args == (shape, fps)
    assert num_steps == [steps]


def test_same_seed_gives_identical_frames_and_another_seed_differs(pipe):
    first = pipe(job("t2v", seed=7)).frames
    again = pipe(job("t2v", seed=7)).frames
    other = pipe(job("t2v", seed=8)).frames
    np.testing.assert_array_equal(first, again)
    assert np.abs(first.astype(int) - other.astype(int)).mean() > 1.0


class RecordingSink:
    """A ``FrameSink`` that keeps what it is given."""

    def __init__(self):
        self.started, self.chunks = None, []

    def start(self, shape, fps, sound, sampling_rate):
        assert not self.chunks, "start comes before the first chunk"
        self.started = (shape, fps, sound, sampling_rate)

    def write(self, frames):
        self.chunks.append(frames)


def test_a_frame_sink_gets_the_frames_chunk_by_chunk_as_views_of_the_output(pipe, monkeypatch):
    whole = pipe(job("t2v", seed=7)).frames  # [9, 32, 48, 3]
    real = WanVAE.decode_chunks

    def in_time(vae, latents):  # the CPU's decoder gives one chunk; fastvae's on CUDA one latent frame a chunk
        (video,) = real(vae, latents)  # [3, 9, H, W]
        yield from video.split([1, 4, 4], dim=1)

    monkeypatch.setattr(WanVAE, "decode_chunks", in_time)
    sink = RecordingSink()
    out = pipe(job("t2v", seed=7), frames=sink)
    assert sink.started == ((9, 32, 48, 3), out.fps, None, None)
    assert [len(chunk) for chunk in sink.chunks] == [1, 4, 4]
    np.testing.assert_array_equal(np.concatenate(sink.chunks), whole)
    np.testing.assert_array_equal(out.frames, whole)
    assert all(np.shares_memory(chunk, out.frames) for chunk in sink.chunks)  # the clip is held once


# -- conditioning ---------------------------------------------------------------------------------


def test_i2v_frame_0_is_the_vae_round_trip_of_the_image(pipe):
    # The image is already the output size, so preprocessing is the identity and the reference is
    # the VAE's own encode -> decode. Frame 0 is re-pinned every step and the Wan decoder is causal,
    # so the pipeline must reproduce that round trip, not merely resemble the input.
    image = rng_pixels((32, 32, 3), seed=3)
    out = pipe(job("i2v", image=image)).frames
    expected = vae_round_trip(pipe, image[None])[0]
    assert np.abs(out[0].astype(int) - expected.astype(int)).max() <= ROUND_TRIP_TOLERANCE
    # The tiny random VAE is not constant: another image round-trips to something else.
    other = vae_round_trip(pipe, 255 - image[None])[0]
    assert np.abs(other.astype(int) - expected.astype(int)).mean() > 5.0


@pytest.mark.parametrize(
    "clip_frames,kept",
    [
        pytest.param(7, [0, 1, 2, 3, 4], id="long-clip"),
        pytest.param(3, [0, 1, 2, 2, 2], id="short-clip-holds-its-last-frame"),
    ],
)
def test_v2v_keeps_the_first_five_frames_as_their_vae_round_trip(pipe, clip_frames, kept):
    video = rng_pixels((clip_frames, 32, 32, 3), seed=4)
    out = pipe(job("v2v", video=video)).frames
    # Latent frames 0 and 1 are the clean encode of pixel frames 0..4; decoded pixel frames 0..4
    # depend on those two latent frames only.
    expected = vae_round_trip(pipe, video[kept])
    assert np.abs(out[:5].astype(int) - expected.astype(int)).max() <= ROUND_TRIP_TOLERANCE


def test_conditioned_latent_frames_are_pinned_and_marked_at_every_step(pipe, monkeypatch):
    spy = ModelSpy(pipe.model, monkeypatch)
    pipe(job("v2v", steps=4))
    calls = spy.of("velocity")
    first, last = calls[0]["latents"], calls[-1]["latents"]
    for call in calls:
        assert call["condition_frames"] == (0, 1)
        torch.testing.assert_close(call["latents"][:, :2], first[:, :2], rtol=0, atol=0)
    assert not torch.allclose(last[:, 2:], first[:, 2:])  # while the noisy frames do move


# -- CFG protocol -----------------------------------------------------------------------------------


def test_each_step_sets_precision_then_runs_cond_and_uncond_with_their_own_caches(pipe, monkeypatch):
    spy = ModelSpy(pipe.model, monkeypatch)
    pipe(job("t2v", negative_prompt="blurry"))
    calls = [e["call"] for e in spy.events]
    # The model is told the passes' shape (CUDA graphs keep or free what that length needs), the UND tower runs
    # once per branch per job, then each step: precision, cond pass, uncond pass.
    assert calls == ["prepare_gen", "encode_text", "encode_text"] + ["step", "velocity", "velocity"] * STEPS
    steps, passes = spy.of("step"), spy.of("velocity")
    (prepared,) = spy.of("prepare_gen")
    assert prepared["shape"] == tuple(passes[0]["latents"].shape)
    assert prepared["sound_frames"] == (None if passes[0]["sound"] is None else passes[0]["sound"].shape[1])
    cond_ids, uncond_ids = passes[0]["ids"], passes[1]["ids"]
    assert cond_ids != uncond_ids
    for i in range(STEPS):
        cond, uncond = passes[2 * i], passes[2 * i + 1]
        assert (steps[i]["step"], steps[i]["num_steps"]) == (i, STEPS)
        assert cond["ids"] == cond_ids and spy.caches[cond["cache"]] == cond_ids
        assert uncond["ids"] == uncond_ids and spy.caches[uncond["cache"]] == uncond_ids
        assert cond["t"] == uncond["t"]
        torch.testing.assert_close(cond["latents"], uncond["latents"], rtol=0, atol=0)


def test_t2i_runs_the_uncond_pass_only_inside_the_guidance_interval(pipe, monkeypatch):
    spy = ModelSpy(pipe.model, monkeypatch)
    steps = 8
    pipe(job("t2i", steps=steps))
    passes = spy.of("velocity")
    cond_ids = passes[0]["ids"]
    timesteps = [p["t"] for p in passes if p["ids"] == cond_ids]
    uncond_timesteps = [p["t"] for p in passes if p["ids"] != cond_ids]
    assert len(timesteps) == steps
    inside = [t for t in timesteps if 400.0 <= t <= 1000.0]
    assert 0 < len(inside) < steps, "the schedule must cross t=400 for this test to mean anything"
    assert uncond_timesteps == inside


def test_guidance_1_runs_one_pass_per_step_and_builds_no_uncond_cache(pipe, monkeypatch):
    spy = ModelSpy(pipe.model, monkeypatch)
    pipe(job("t2v", guidance=1.0))
    assert len(spy.of("encode_text")) == 1
    assert len(spy.of("velocity")) == STEPS


def test_distilled_checkpoint_runs_its_fixed_schedule_with_one_pass_per_step(distilled_pipe, monkeypatch):
    spy = ModelSpy(distilled_pipe.model, monkeypatch)
    out = distilled_pipe(job("t2v", steps=None))
    assert out.info["scheduler"] == "FlowMatchEulerDiscreteScheduler"
    assert out.info["steps"] == 4 and out.info["guidance"] == 1.0 and out.info["flow_shift"] is None
    timesteps = [p["t"] for p in spy.of("velocity")]
    np.testing.assert_allclose(timesteps, [999.0, 750.0, 500.0, 250.0], rtol=1e-6)
    # The stochastic steps draw their noise from the job's generator: a seed still reproduces.
    np.testing.assert_array_equal(out.frames, distilled_pipe(job("t2v", steps=None)).frames)


def test_distilled_i2v_keeps_frame_0_despite_the_stochastic_renoising(distilled_pipe):
    image = rng_pixels((32, 32, 3), seed=5)
    out = distilled_pipe(job("i2v", image=image, steps=None)).frames
    expected = vae_round_trip(distilled_pipe, image[None])[0]
    assert np.abs(out[0].astype(int) - expected.astype(int)).max() <= ROUND_TRIP_TOLERANCE


@pytest.fixture(scope="module")
def fp8_pipe(root, tmp_path_factory):
    from cosmos3.checkpoint.fp8_export import export_fp8

    # ModelOpt calibrates on a real render of our pipeline (its default: the published step policy).
    fp8 = export_fp8(root, tmp_path_factory.mktemp("fp8") / "ckpt", [job("t2v", steps=2)], max_shard_size="64KB")
    return Cosmos3Pipeline.from_pretrained(fp8, device="cpu", dtype=torch.float32)


def test_static_fp8_checkpoint_picks_each_steps_precision_before_both_passes(fp8_pipe, monkeypatch):
    from cosmos3.quant import STATIC_FP8, W8A16

    gen_linear = fp8_pipe.model.step_controller.gen_linears[0]
    methods = []
    forward = fp8_pipe.model.forward

    def record(*args, **kwargs):
        methods.append(gen_linear.method)
        return forward(*args, **kwargs)

    monkeypatch.setattr(fp8_pipe.model, "forward", record)
    out = fp8_pipe(job("t2v", steps=8))
    assert out.info["precision"] == "fp8-static" and out.info["fp8_accumulation"] == "fast"  # the default
    a16 = out.info["step_policy"]["a16_steps"]
    assert a16 == [0, 1, 2, 5, 6, 7]  # the published first 3 / last 3
    assert methods == [W8A16 if i in a16 else STATIC_FP8 for i in range(8) for _branch in ("cond", "uncond")]


# -- parity with the published diffusers pipeline ------------------------------------------------


@pytest.fixture(scope="module")
def diffusers_pipe(root, pipe):
    from testbed.reference import diffusers_pipeline

    return diffusers_pipeline(root, pipe)


@pytest.mark.parametrize(
    "negative,spec",
    [
        pytest.param("", PromptSpec(frames=189, fps=24.0, height=720, width=1280), id="video-empty-negative"),
        pytest.param("blurry. ugly", PromptSpec(frames=61, fps=16.0, height=480, width=832), id="video-negative"),
        pytest.param("", PromptSpec(frames=1, fps=24.0, height=1024, width=1024), id="image"),
    ],
)
def test_prompt_tokens_match_the_diffusers_pipeline(pipe, diffusers_pipe, negative, spec):
    ours = pipe.tokenizer.encode_pair(PROMPT + ".", negative, spec)
    theirs = diffusers_pipe.tokenize_prompt(
        PROMPT + ".", negative, num_frames=spec.frames, height=spec.height, width=spec.width, fps=spec.fps
    )
    assert ours == theirs


def test_t2v_frames_match_the_diffusers_pipeline(pipe, diffusers_pipe):
    width, height, frames = JOBS["t2v"]
    ours = pipe(job("t2v", seed=11, negative_prompt="blurry")).frames
    theirs = diffusers_pipe(
        prompt=PROMPT, negative_prompt="blurry", num_frames=frames, height=height, width=width, fps=24.0,
        num_inference_steps=STEPS, guidance_scale=6.0, generator=torch.Generator().manual_seed(11),
        output_type="np", enable_safety_check=False,
    ).video
    theirs = np.round(theirs * 255).astype(np.uint8)
    assert ours.shape == theirs.shape
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= ROUND_TRIP_TOLERANCE


# -- requests a user gets wrong -------------------------------------------------------------------

BAD_REQUESTS = [
    pytest.param({"width": 40}, r"width: 40 is not a multiple of 16 \(use 32 or 48\)", id="width"),
    pytest.param({"height": 8}, r"height: 8 is not a multiple of 16 \(use 16\)", id="height-too-small"),
    pytest.param({"frames": 10}, r"frames: 10 is not 4k\+1, .* \(use 9 or 13\)", id="frames-not-4k+1"),
    pytest.param({"task": "t2i", "frames": 5}, r"task t2i renders one frame", id="t2i-frames"),
    pytest.param({"task": "i2v"}, r"image: task i2v needs an input image \(set image=", id="i2v-no-image"),
    pytest.param({"task": "v2v"}, r"video: task v2v needs an input video", id="v2v-no-video"),
    pytest.param({"image": np.zeros((32, 48, 3), np.uint8)}, r"task t2v takes no image .*use task i2v", id="t2v-image"),
    pytest.param({"task": "i2v", "image": "/nonexistent/cat.png"}, r"image: no file at /nonexistent/cat.png",
                 id="missing-image-file"),
    pytest.param({"task": "i2v", "frames": 1, "image": np.zeros((32, 48, 3), np.uint8)},
                 r"task i2v keeps 1 latent frame\(s\) .* needs frames >= 5", id="i2v-one-frame"),
    pytest.param({"task": "v2v", "frames": 5, "video": np.zeros((5, 32, 48, 3), np.uint8)},
                 r"needs frames >= 9", id="v2v-too-short"),
    pytest.param({"task": "t2x"}, r"task: 't2x' is not one of t2v, t2i, i2v, v2v", id="task"),
    pytest.param({"steps": 0}, r"steps: 0 is not a positive whole number", id="steps"),
    pytest.param({"steps": 1001}, r"steps: 1001 is above the limit of 1000", id="steps-max"),
    pytest.param({"guidance": -1.0}, r"guidance: -1.0 is outside the limits \[0, 20\]", id="guidance"),
    pytest.param({"guidance": 1e308}, r"guidance: 1e\+308 is outside the limits \[0, 20\]", id="guidance-huge"),
    pytest.param({"fps": 0}, r"fps: 0 is outside the limits \[1, 120\]", id="fps"),
    pytest.param({"fps": 1e6}, r"fps: 1000000.0 is outside the limits \[1, 120\]", id="fps-huge"),
    pytest.param({"frames": 4_000_000_001}, r"frames: 4000000001 is above the limit of 509", id="frames-max"),
    pytest.param({"width": 1 << 20}, r"width: 1048576 is above the limit of 4096 pixels a side", id="width-max"),
    pytest.param({"prompt": "a red circle " * 1400}, r"prompt: 4,2\d\d tokens with the system prompt and metadata "
                 r"sentences, above the text tokenizer's limit of 4,096; shorten it", id="prompt-too-long"),
    pytest.param({"seed": -1}, r"seed: -1 is not a whole number", id="seed"),
    pytest.param({"width": 40, "height": 20}, r"2 problems in render request:\n  width: .*\n  height: ",
                 id="all-problems-at-once"),
]


@pytest.mark.parametrize("fields,message", BAD_REQUESTS)
def test_bad_requests_are_refused_with_the_field_and_the_fix(pipe, fields, message):
    request = RenderRequest(**{"task": "t2v", "prompt": PROMPT, "width": 48, "height": 32, "frames": 9, **fields})
    with pytest.raises(PipelineError, match=message):
        pipe(request)


@pytest.mark.parametrize(
    "fields,message",
    [
        pytest.param({"steps": 35}, r"fixed 4-step schedule, got 35", id="steps"),
        pytest.param({"guidance": 6.0}, r"guidance baked in \(1.0\), got 6.0", id="guidance"),
        pytest.param({"negative_prompt": "blurry"}, r"runs no unconditional pass", id="negative-prompt"),
    ],
)
def test_distilled_checkpoint_refuses_sampling_overrides(distilled_pipe, fields, message):
    with pytest.raises(PipelineError, match=message):
        distilled_pipe(job("t2v", **{"steps": None, **fields}))


def test_unreadable_conditioning_inputs_are_refused(pipe, tmp_path):
    bad = tmp_path / "not-an-image.png"
    bad.write_text("hello")
    with pytest.raises(PipelineError, match=r"image: cannot read .*not-an-image.png"):
        pipe(job("i2v", image=bad))
    with pytest.raises(PipelineError, match=r"image: expected an RGB array shaped \[H, W, 3\], got shape \(2, 32"):
        pipe(job("i2v", image=np.zeros((2, 32, 32, 3), np.uint8)))
    with pytest.raises(PipelineError, match=r"video: float pixels must lie in \[0, 1\]"):
        pipe(job("v2v", video=np.full((5, 32, 32, 3), 2.0)))


# -- media ------------------------------------------------------------------------------------------


def levels(video: torch.Tensor) -> torch.Tensor:
    """``[-1, 1]`` floats back to uint8 levels."""
    return ((video + 1.0) * 127.5).round()


def test_resize_cover_crop_takes_the_centre_of_a_wide_image():
    image = np.zeros((32, 96, 3), np.uint8)
    image[:, 32:64] = 200  # the middle third
    out = resize_cover_crop(image[None], 32, 32)  # cover scale 1: a pure centre crop
    assert out.shape == (3, 1, 32, 32)
    assert torch.all(levels(out) == 200)


def test_resize_cover_crop_scales_to_cover_then_crops():
    image = np.zeros((20, 40, 3), np.uint8)
    image[:, :20] = 90  # left half; 1:2 -> 32x32 scales to 32x64 and keeps columns 16..47
    out = levels(resize_cover_crop(image[None], 32, 32))
    assert out.shape == (3, 1, 32, 32)
    assert torch.all(out[..., :14] == 90) and torch.all(out[..., 18:] == 0)  # the edge is antialiased


def test_resize_cover_crop_reads_read_only_frames_without_a_warning():
    """An image read through PIL is a read-only array: torch warns of undefined behaviour on such a tensor."""
    image = rng_pixels((20, 40, 3))
    frozen = image.copy()
    frozen.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = resize_cover_crop(frozen[None], 32, 32)
    torch.testing.assert_close(out, resize_cover_crop(image[None], 32, 32), rtol=0, atol=0)


def test_media_paths_and_arrays_load_as_uint8_rgb(tmp_path):
    import imageio.v3 as iio

    image = rng_pixels((16, 24, 3))
    iio.imwrite(tmp_path / "a.png", image)
    np.testing.assert_array_equal(load_image(tmp_path / "a.png"), image)
    np.testing.assert_array_equal(load_image(image / 255.0), image)
    np.testing.assert_array_equal(load_image(image[..., 0]), np.repeat(image[..., :1], 3, axis=-1))
    iio.imwrite(tmp_path / "v.mp4", rng_pixels((6, 32, 48, 3)), fps=24)
    video = load_video(tmp_path / "v.mp4")
    assert video.shape == (6, 32, 48, 3) and video.dtype == np.uint8


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoded_frames_come_back_as_contiguous_uint8_levels_and_leave_the_video_alone(device, dtype):
    video = (torch.rand((3, 4, 16, 24), generator=torch.Generator().manual_seed(0)) * 2.4 - 1.2).to(dtype)
    expected = levels(video.float().clamp(-1, 1)).to(torch.uint8).permute(1, 2, 3, 0).numpy()  # [T, H, W, 3]
    before = video.clone()
    frames = to_uint8_frames(video.to(device))
    # C order: ffmpeg's pipe and the PNG writer read the buffer as is, with no strided gather on the host
    assert frames.flags["C_CONTIGUOUS"] and frames.dtype == np.uint8 and frames.shape == (4, 16, 24, 3)
    np.testing.assert_array_equal(frames, expected)
    assert torch.equal(video, before)  # the levels are computed in a copy


# -- checkpoint -------------------------------------------------------------------------------------


def test_incomplete_checkpoint_is_refused_naming_what_is_missing(root, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(CheckpointError, match=r"missing vae \(expected model_index.json, transformer, vae"):
        Cosmos3Pipeline.from_pretrained(broken)


def test_the_checkpoint_identity_is_the_fingerprint_of_the_files_it_loads(root, pipe):
    """One identity: what the farm's config hash holds is what every render's info (and sidecar) names."""
    real = root.resolve()
    assert pipe(job("t2v")).info["checkpoint"] == {"path": str(real), "fingerprint": fingerprint(real).sha256}


# -- the VAE's load ---------------------------------------------------------------------------------


def _broken_copy(root, tmp_path, breakage) -> object:
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    breakage(broken / "vae")
    return broken


def _edit_config(vae, **changes) -> None:
    path = vae / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _truncate(path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


# Visible without diffusers: from_pretrained fails, whichever way the VAE loads.
VISIBLE_BREAKAGES = [
    pytest.param(lambda vae: _edit_config(vae, z_dim=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4),
                 CheckpointError, r"transformer latent_channel=8 does not match vae z_dim=4 \(.*vae/config.json\)",
                 id="z_dim"),
    pytest.param(lambda vae: _edit_config(vae, latents_std=[1.0] * 3), ConfigError,
                 r"vae/config.json: latents_mean and latents_std need z_dim=8 entries each, got 8 and 3",
                 id="latents-std-length"),
    pytest.param(lambda vae: (vae / "config.json").unlink(), ConfigError, r"vae/config.json: missing",
                 id="no-config"),
    pytest.param(lambda vae: (vae / "config.json").write_text("{"), ConfigError,
                 r"vae/config.json: not valid JSON", id="config-not-json"),
    pytest.param(lambda vae: (vae / WEIGHTS).unlink(), CheckpointError,
                 rf"vae: no {WEIGHTS} \(the VAE's weights\)", id="no-weights"),
    pytest.param(lambda vae: (vae / WEIGHTS).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"),
                 CheckpointError, r"the safetensors header is not JSON", id="header-garbage"),
    pytest.param(lambda vae: _truncate(vae / WEIGHTS), CheckpointError, r"\(truncated; re-download", id="truncated"),
]


@pytest.mark.parametrize("vae_load", ["eager", "background"])
@pytest.mark.parametrize("breakage,error,message", VISIBLE_BREAKAGES)
def test_a_vae_broken_visibly_fails_from_pretrained(root, tmp_path, vae_load, breakage, error, message):
    with pytest.raises(error, match=message):
        Cosmos3Pipeline.from_pretrained(_broken_copy(root, tmp_path, breakage), vae_load=vae_load)


def test_a_background_vae_is_built_after_from_pretrained_returns_and_waited_for_by_the_first_job(
        root, pipe, monkeypatch):
    # The build blocks until the first job reaches its wait, so from_pretrained can only return without it.
    reached, build, wait = threading.Event(), WanVAE.build.__func__, VAEBuild.wait

    def blocked_build(cls, *args, **kwargs):
        assert reached.wait(timeout=60), "no job waited for the VAE"
        return build(cls, *args, **kwargs)

    def job_waits(self):
        reached.set()
        return wait(self)

    monkeypatch.setattr(WanVAE, "build", classmethod(blocked_build))
    monkeypatch.setattr(VAEBuild, "wait", job_waits)
    background = Cosmos3Pipeline.from_pretrained(root, vae_load="background")
    assert background.load_timings["vae"] is None and background.load_timings["total"] > 0

    first = background(job("i2v", seed=5))
    assert first.timings["vae_wait"] > 0 and background.load_timings["vae"] > 0
    np.testing.assert_array_equal(first.frames, pipe(job("i2v", seed=5)).frames)
    assert background(job("t2v")).timings["vae_wait"] == 0.0


def test_a_warm_up_builds_the_background_vae_and_the_first_job_waits_for_nothing(root, pipe):
    background = Cosmos3Pipeline.from_pretrained(root, vae_load="background")
    background.warm_up()
    assert background.load_timings["vae"] > 0  # built before any job asked
    first = background(job("t2v", seed=3))
    assert first.timings["vae_wait"] == 0.0
    np.testing.assert_array_equal(first.frames, pipe(job("t2v", seed=3)).frames)


def test_the_warm_up_decodes_the_default_sizes_of_the_tasks_a_checkpoint_renders(root, pipe, tmp_path):
    z, factor = pipe._vae.config.z_dim, pipe._vae.config.spatial_factor
    image, video = (pipeline.resolve(RenderRequest(task=task, prompt="x"), pipe.rules) for task in ("t2i", "t2v"))
    still = (z, 1, image.height // factor, image.width // factor)
    clip = (z, 2, video.height // factor, video.width // factor)  # the first latent frame and one after it
    assert pipe.warm_up_shapes() == [still, clip]
    image_only = tmp_path / "image-only"
    shutil.copytree(root, image_only)
    (image_only / "README.md").write_text("---\npipeline_tag: text-to-image\n---\nAn image model.\n")
    assert Cosmos3Pipeline.from_pretrained(image_only).warm_up_shapes() == [still]


def test_a_t2v_job_denoises_while_the_vae_builds_and_waits_only_at_its_decode(root, pipe, monkeypatch):
    # The build finishes only after the job's last step: a job that waited before its steps would never get there.
    last_step, build = threading.Event(), WanVAE.build.__func__

    def build_after_the_steps(cls, *args, **kwargs):
        assert last_step.wait(timeout=60), "the job did not denoise before waiting for the VAE"
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(WanVAE, "build", classmethod(build_after_the_steps))
    background = Cosmos3Pipeline.from_pretrained(root, vae_load="background")

    def on_step(i, n):
        if i == n - 1:
            last_step.set()

    out = background(job("t2v", seed=3), callback=on_step)
    assert out.timings["vae_wait"] > 0
    np.testing.assert_array_equal(out.frames, pipe(job("t2v", seed=3)).frames)


def test_a_background_load_returns_while_the_vaes_thread_holds_the_library_import_lock(root, monkeypatch):
    # diffusers' import holds LIBRARY_IMPORT in the VAE's thread (seconds on a worker's host). Here the build holds
    # it until from_pretrained has returned: a load that needed it after the thread started (the text tokenizer's
    # import did) would wait out the timeout.
    loaded, build, returned_first = threading.Event(), WanVAE.build.__func__, []

    def import_until_loaded(cls, *args, **kwargs):
        with LIBRARY_IMPORT:
            returned_first.append(loaded.wait(timeout=60))
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(WanVAE, "build", classmethod(import_until_loaded))
    background = Cosmos3Pipeline.from_pretrained(root, vae_load="background")
    loaded.set()
    assert background.load_timings["tokenizer"] > 0
    assert background(job("t2i")).frames.shape[0] == 1  # the job waits for the VAE, built once the lock is free
    assert returned_first == [True]


def test_the_text_tokenizer_loads_beside_the_transformer_and_imports_before_the_vae(root, monkeypatch):
    # The tokenizer's load waits until the transformer's has begun: loaded before it, as it was, it would wait out
    # the timeout. The VAE's build records when it gets LIBRARY_IMPORT, which the tokenizer's load holds throughout.
    transformer_loading, order = threading.Event(), []
    load_transformer, load_tokenizer = pipeline.load_transformer, PromptTokenizer._load.__func__
    build = WanVAE.build.__func__

    def mark_then_load_transformer(*args, **kwargs):
        transformer_loading.set()
        return load_transformer(*args, **kwargs)

    def load_tokenizer_once_the_transformer_loads(cls, path):
        order.append(("tokenizer", transformer_loading.wait(timeout=60)))
        return load_tokenizer(cls, path)

    def build_noting_the_lock(cls, *args, **kwargs):
        with LIBRARY_IMPORT:
            order.append(("vae", transformer_loading.is_set()))
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(pipeline, "load_transformer", mark_then_load_transformer)
    monkeypatch.setattr(PromptTokenizer, "_load", classmethod(load_tokenizer_once_the_transformer_loads))
    monkeypatch.setattr(WanVAE, "build", classmethod(build_noting_the_lock))
    loaded = Cosmos3Pipeline.from_pretrained(root, vae_load="eager")
    assert order == [("tokenizer", True), ("vae", True)]
    assert loaded.load_timings["total"] >= loaded.load_timings["tokenizer"] > 0
    assert loaded(job("t2i")).frames.shape[0] == 1


def test_a_text_tokenizer_that_does_not_load_is_a_checkpoint_error_naming_its_directory(root, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    (broken / "text_tokenizer" / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"text_tokenizer: the text tokenizer did not load \(.*tokenizer.json"):
        Cosmos3Pipeline.from_pretrained(broken, vae_load="background")
    (broken / "text_tokenizer" / "tokenizer_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"text_tokenizer: no tokenizer_config.json"):
        Cosmos3Pipeline.from_pretrained(broken)
    assert Cosmos3Pipeline.from_pretrained(root, vae_load="background").tokenizer is not None  # the lock was freed


@pytest.mark.parametrize("how", ["renamed", "misshapen"])
def test_vae_weights_only_diffusers_can_refuse_fail_every_job_of_a_background_load(root, tmp_path, how):
    broken = _broken_copy(root, tmp_path, lambda vae: mismatch_weights(vae.parent, how))
    message = rf"broken/vae: the VAE did not build: CheckpointError: .*{WEIGHTS}: does not match vae/config.json"
    with pytest.raises(VAELoadError, match=message):
        Cosmos3Pipeline.from_pretrained(broken)

    background = Cosmos3Pipeline.from_pretrained(broken, vae_load="background")
    for _ in range(2):  # nothing renders without the VAE
        with pytest.raises(VAELoadError, match=message):
            background(job("t2v"))
    with pytest.raises(PipelineError, match="width: 33 is not a multiple of 16"):  # still the request's fault
        background(job("t2v", width=33))


REPO = Path(__file__).resolve().parents[2]
TOY_FP8 = REPO / "checkpoints" / "toy" / "fp8"  # it has sound


# Run in a fresh process: records every diffusers or transformers module imported by a thread that did not hold
# LIBRARY_IMPORT.
IMPORT_WATCH = """
import sys, threading
import cosmos3.library_import as lock_module

held = set()


class Watched:  # the lock, remembering which thread holds it
    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self):
        self._lock.acquire()
        held.add(threading.get_ident())

    def __exit__(self, *exc):
        held.discard(threading.get_ident())
        self._lock.release()


class Finder:  # consulted for every module not imported yet
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("diffusers", "transformers") and threading.get_ident() not in held:
            unlocked.append((name, threading.current_thread().name))
        return None


unlocked = []
lock_module.LIBRARY_IMPORT = Watched()  # before any cosmos3 module takes it by name
sys.meta_path.insert(0, Finder())
from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest

pipe = Cosmos3Pipeline.from_pretrained(sys.argv[1], vae_load=sys.argv[2])
out = pipe(RenderRequest(task="t2i", prompt="a red ball", width=96, height=96, steps=2))
assert pipe.sound_tokenizer is not None and out.frames.shape == (1, 96, 96, 3)
assert not unlocked, f"modules imported without LIBRARY_IMPORT: {unlocked[:5]}"
"""


@pytest.mark.parametrize("vae_load", ["eager", "background"])
def test_every_library_import_holds_the_lock_beside_the_vae_build(vae_load):
    """diffusers' and transformers' lazy modules break when two threads import them (the sound tokenizer's, the
    text tokenizer's or a first job's scheduler's, beside the VAE thread's: ImportError under load), so each of
    cosmos3's imports from them holds cosmos3.library_import.LIBRARY_IMPORT; a fresh process loads the toy (sound)
    checkpoint and renders with every diffusers and transformers module imported under it."""
    run = subprocess.run([sys.executable, "-c", IMPORT_WATCH, str(TOY_FP8), vae_load], capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]


# Run in a fresh process: the VAE's build begins only once the main thread has ended (the interpreter's exit has
# begun), then marks that it finished.
EXIT_DURING_BUILD = """
import sys, threading, time
from pathlib import Path
from cosmos3.pipeline import Cosmos3Pipeline
from cosmos3.vae import WanVAE

build = WanVAE.build.__func__


def build_after_main_ended(cls, *args, **kwargs):
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    vae = build(cls, *args, **kwargs)
    Path(sys.argv[2]).touch()
    return vae


WanVAE.build = classmethod(build_after_main_ended)
Cosmos3Pipeline.from_pretrained(sys.argv[1], vae_load="background")
"""


def test_a_process_exits_only_once_its_background_builds_have_ended(tmp_path):
    """A worker stopped right after its start, or a script that only loads, exits while the VAE (and the sound
    tokenizer) still build: the exit waits for them. A daemon build thread was abandoned inside torch instead, which
    aborted the process ("terminate called without an active exception", exit status 134) in 4 of 4 runs of a
    script that made the tiny sound checkpoint, loaded it and returned."""
    built = tmp_path / "built"
    run = subprocess.run([sys.executable, "-c", EXIT_DURING_BUILD, str(TOY_FP8), str(built)], capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0 and "terminate called" not in run.stderr, run.stderr[-3000:]
    assert built.exists(), "the process exited before the VAE's build ended"


def test_an_unknown_vae_load_is_refused(root):
    with pytest.raises(ValueError, match=r"vae_load='lazy': expected one of eager, background"):
        Cosmos3Pipeline.from_pretrained(root, vae_load="lazy")


@pytest.mark.gpu
@pytest.mark.parametrize("task", ["t2i", "t2v"])
def test_cuda_render_with_graphs_equals_eager(root, task):
    request = job(task, seed=3)
    eager = Cosmos3Pipeline.from_pretrained(root, device="cuda", cuda_graphs=False)(request)
    pipe = Cosmos3Pipeline.from_pretrained(root, device="cuda")
    assert pipe.vae.dtype == torch.bfloat16 and {p.dtype for p in pipe.vae.vae.parameters()} == {torch.bfloat16}
    graphed = pipe(request)
    assert graphed.frames.dtype == np.uint8 and graphed.frames.shape == eager.frames.shape
    assert np.array_equal(graphed.frames, eager.frames)
    for out in (eager, graphed):  # steps timed on the device's queue: one positive figure a step, inside the job's
        steps = out.timings["steps"]
        assert len(steps) == out.info["steps"] and min(steps) > 0 and sum(steps) < out.timings["total"]
