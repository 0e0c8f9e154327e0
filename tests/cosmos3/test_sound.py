"""Clips with sound on a tiny random checkpoint with ``sound_gen`` and a tiny ``Cosmos3AVAEAudioTokenizer`` (CPU, fp32).

Our T2V-with-sound frames and waveform equal diffusers' ``Cosmos3OmniPipeline(enable_sound=True)`` on the
same seed, and so do the sound tokens' positions and timesteps at every call; sound latents are sized from
the clip's duration; both CFG passes see the same sound latents; a sound request on a checkpoint that
cannot make sound, and a broken ``sound_tokenizer/``, fail with messages naming the field or file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3.audio import SoundTokenizer
from cosmos3.errors import CheckpointError, ConfigError, PipelineError, SoundTokenizerLoadError
from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest
from cosmos3.rules.checkpoint_header import check_sound_dir
from cosmos3.rules.config import Cosmos3Config, SoundConfig
from tests.cosmos3.test_pipeline import PROMPT, ROUND_TRIP_TOLERANCE, STEPS, ModelSpy, RecordingSink, job
from tests.tiny_checkpoint import TINY_SOUND_TOKENIZER, make_tiny_checkpoint, mismatch_weights
from toy import measure

RATE = TINY_SOUND_TOKENIZER["sampling_rate"]
HOP = 320  # prod(dec_strides) of the tiny tokenizer: 8000 Hz / 320 = 25 latent frames per second
# fp32 on both sides; the two implementations order a few reductions differently.
WAVEFORM_TOLERANCE = 1e-5  # of the waveform's peak (measured: 6e-7)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("sound"), sound=True)


@pytest.fixture(scope="module")
def pipe(root):
    return Cosmos3Pipeline.from_pretrained(root, device="cpu", dtype=torch.float32)


# -- sizing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frames,fps,rate,hop,samples,latent_frames",
    [
        # Nano: 189 frames at 24 fps = 7.875 s; 48 kHz -> 378,000 samples; / 1920 = 196.875 -> 197 frames.
        pytest.param(189, 24.0, 48000, 1920, 378000, 197, id="nano-720p-default"),
        # 121 frames at 24 fps = 5.041666 s -> int(242,000.0) samples -> 126.04 -> 127 frames.
        pytest.param(121, 24.0, 48000, 1920, 242000, 127, id="nano-121"),
        # the tiny tokenizer: 9 frames at 24 fps = 0.375 s -> 3,000 samples -> 9.375 -> 10 frames.
        pytest.param(9, 24.0, 8000, 320, 3000, 10, id="tiny"),
        # 13 frames at 30 fps = 0.4333 s -> int(3466.67) = 3466 samples -> 10.83 -> 11 frames.
        pytest.param(13, 30.0, 8000, 320, 3466, 11, id="tiny-30fps"),
    ],
)
def test_sound_latents_are_sized_from_the_clips_duration(frames, fps, rate, hop, samples, latent_frames):
    config = SoundConfig(sound_dim=64, latent_fps=25.0, sampling_rate=rate, hop_size=hop, channels=2)
    assert config.samples(frames, fps) == samples
    assert config.latent_frames(frames, fps) == latent_frames


def test_a_sound_render_carries_a_float_waveform_of_the_clips_duration(pipe):
    out = pipe(job("t2v"))
    assert out.sampling_rate == RATE
    assert out.sound.dtype == np.float32 and out.sound.shape == (2, 3000)  # stereo, 9 / 24 s at 8 kHz
    assert np.isfinite(out.sound).all() and out.sound.std() > 0
    assert out.info["sound"] == {"latent_frames": 10, "samples": 3000, "sampling_rate": RATE}


def test_a_frame_sink_is_given_the_sound_before_the_first_frame(pipe):
    sink = RecordingSink()  # it checks that start comes first
    out = pipe(job("t2v", seed=3), frames=sink)
    shape, fps, sound, rate = sink.started
    assert (shape, fps, rate) == (out.frames.shape, out.fps, RATE) and sound is out.sound
    np.testing.assert_array_equal(np.concatenate(sink.chunks), out.frames)


@pytest.mark.parametrize("task", ["i2v", "v2v"])
def test_conditioned_tasks_render_sound_too(pipe, task):
    out = pipe(job(task))
    assert out.sound.shape == (2, int(out.frames.shape[0] / 24.0 * RATE))


def test_sound_follows_the_checkpoint_unless_turned_off_and_images_stay_silent(pipe):
    assert pipe(job("t2v", sound=False)).sound is None
    assert pipe(job("t2v", sound=None)).sound is not None
    image = pipe(job("t2i"))
    assert image.sound is None and image.sampling_rate is None and image.info["sound"] is None


def test_same_seed_gives_the_same_waveform(pipe):
    np.testing.assert_array_equal(pipe(job("t2v", seed=4)).sound, pipe(job("t2v", seed=4)).sound)
    assert not np.allclose(pipe(job("t2v", seed=4)).sound, pipe(job("t2v", seed=5)).sound)


def test_both_cfg_passes_see_the_same_sound_latents_and_sound_moves_every_step(pipe, monkeypatch):
    spy = ModelSpy(pipe.model, monkeypatch)
    pipe(job("t2v", negative_prompt="blurry"))
    passes = spy.of("velocity")
    assert len(passes) == 2 * STEPS
    for i in range(STEPS):
        cond, uncond = passes[2 * i], passes[2 * i + 1]
        assert cond["sound"].shape == (8, 10)
        torch.testing.assert_close(cond["sound"], uncond["sound"], rtol=0, atol=0)
    for before, after in zip(passes[::2], passes[2::2], strict=False):
        assert not torch.allclose(before["sound"], after["sound"])


# -- parity with the published diffusers pipeline ------------------------------------------------


class TransformerCalls:
    """Records diffusers' transformer inputs that place and time the sound tokens, one dict per call."""

    def __init__(self, transformer, monkeypatch):
        self.calls: list[dict] = []
        forward = transformer.forward

        def spy(**kwargs):
            self.calls.append({k: kwargs[k] for k in ("position_ids", "und_len", "vision_sequence_indexes",
                                                      "sound_sequence_indexes", "sound_timesteps")})
            return forward(**kwargs)

        monkeypatch.setattr(transformer, "forward", spy)


def test_t2v_with_sound_matches_the_diffusers_pipeline(root, pipe, monkeypatch):
    from testbed.reference import diffusers_pipeline

    width, height, frames = 48, 32, 9
    reference = diffusers_pipeline(root, pipe, sound=True)
    theirs_calls = TransformerCalls(reference.transformer, monkeypatch)
    theirs = reference(
        prompt=PROMPT, negative_prompt="blurry", num_frames=frames, height=height, width=width, fps=24.0,
        num_inference_steps=STEPS, guidance_scale=6.0, generator=torch.Generator().manual_seed(11),
        output_type="np", enable_safety_check=False, enable_sound=True,
    )
    spy = ModelSpy(pipe.model, monkeypatch)
    ours = pipe(job("t2v", seed=11, negative_prompt="blurry"))

    # Frames, as the silent parity test; the waveform to fp32 rounding.
    video = np.round(theirs.video * 255).astype(np.uint8)
    assert np.abs(ours.frames.astype(int) - video.astype(int)).max() <= ROUND_TRIP_TOLERANCE
    waveform = theirs.sound.float().numpy()  # [2, T_s * hop]: diffusers keeps the decoder's whole hops
    assert waveform.shape == (2, 10 * HOP) and ours.sound.shape == (2, 3000)
    peak = np.abs(waveform).max()
    assert peak > 0
    np.testing.assert_allclose(ours.sound, waveform[:, :3000], rtol=0, atol=WAVEFORM_TOLERANCE * peak)

    # The sound tokens: right after the vision tokens, at diffusers' positions, with the step's timestep.
    passes = spy.of("velocity")
    assert len(passes) == len(theirs_calls.calls) == 2 * STEPS
    for call, our in zip(theirs_calls.calls, passes, strict=True):
        und_len, n_vision = call["und_len"], len(call["vision_sequence_indexes"])
        sound_index = call["sound_sequence_indexes"]
        np.testing.assert_array_equal(sound_index.numpy(), und_len + n_vision + np.arange(10))
        assert len(our["ids"]) == und_len and torch.all(call["sound_timesteps"] == our["t"])
        layout = pipe.model.gen_layout(tuple(our["latents"].shape), und_len, 24.0, (), 10)
        cos, sin = pipe.model.rotary_emb(call["position_ids"][:, sound_index].float(), torch.float32)
        torch.testing.assert_close(layout.cos[n_vision:], cos, rtol=0, atol=1e-6)
        torch.testing.assert_close(layout.sin[n_vision:], sin, rtol=0, atol=1e-6)


# -- checkpoints and requests a user gets wrong ------------------------------------------------------


@pytest.fixture(scope="module")
def silent_pipe(tmp_path_factory):
    return Cosmos3Pipeline.from_pretrained(make_tiny_checkpoint(tmp_path_factory.mktemp("silent")), dtype=torch.float32)


def test_sound_on_a_checkpoint_without_sound_gen_is_refused_naming_the_field(silent_pipe):
    with pytest.raises(PipelineError, match=r"sound: this checkpoint cannot generate sound \(its transformer has "
                                            r"sound_gen=false\); set sound to false"):
        silent_pipe(job("t2v", sound=True))
    assert silent_pipe(job("t2v")).sound is None  # unset: silent, as the checkpoint is


def test_sound_on_a_checkpoint_without_a_sound_tokenizer_is_refused(root, tmp_path):
    shutil.copytree(root, tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt" / "sound_tokenizer")
    pipe = Cosmos3Pipeline.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    with pytest.raises(PipelineError, match=r"cannot generate sound \(it ships no sound_tokenizer/ folder\)"):
        pipe(job("t2v", sound=True))


@pytest.mark.parametrize(
    "fields,message",
    [
        pytest.param({"task": "t2i", "sound": True}, r"sound: task t2i renders an image, which has no sound track",
                     id="t2i"),
        pytest.param({"sound": "yes"}, r"sound: expected true or false, got 'yes'", id="not-a-bool"),
    ],
)
def test_bad_sound_requests_are_refused(pipe, fields, message):
    width, height = (32, 32) if fields.get("task") == "t2i" else (48, 32)
    request = RenderRequest(**{"task": "t2v", "prompt": PROMPT, "width": width, "height": height, **fields})
    with pytest.raises(PipelineError, match=message):
        pipe(request)


def _break(folder, how: str) -> None:
    config = folder / "config.json"
    weights = folder / "diffusion_pytorch_model.safetensors"
    if how == "config-not-json":
        config.write_text("{ not json")
    elif how == "config-missing":
        config.unlink()
    elif how == "wrong-class":
        config.write_text(json.dumps({**json.loads(config.read_text()), "_class_name": "AutoencoderOobleck"}))
    elif how == "dim-mismatch":
        config.write_text(json.dumps({**json.loads(config.read_text()), "vocoder_input_dim": 16}))
    elif how == "weights-truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif how == "weights-missing":
        weights.unlink()


@pytest.mark.parametrize(
    "how,error,message",
    [
        pytest.param("config-not-json", ConfigError, r"sound_tokenizer/config.json: not valid JSON",
                     id="config-not-json"),
        pytest.param("config-missing", ConfigError, r"sound_tokenizer/config.json: missing", id="config-missing"),
        pytest.param("wrong-class", ConfigError,
                     r"expected a Cosmos3AVAEAudioTokenizer config, got 'AutoencoderOobleck'", id="wrong-class"),
        pytest.param("dim-mismatch", ConfigError, r"vocoder_input_dim=16 does not match the transformer's sound_dim=8",
                     id="dim-mismatch"),
        pytest.param("weights-truncated", CheckpointError,
                     r"sound_tokenizer/diffusion_pytorch_model.safetensors: .*(truncated|bytes)",
                     id="weights-truncated"),
        pytest.param("weights-missing", CheckpointError,
                     r"sound_tokenizer: no diffusion_pytorch_model.safetensors \(the sound tokenizer's weights\)",
                     id="weights-missing"),
    ],
)
def test_a_broken_sound_tokenizer_folder_is_refused_naming_it(root, tmp_path, how, error, message):
    broken = tmp_path / "ckpt"
    shutil.copytree(root, broken)
    _break(broken / "sound_tokenizer", how)
    for vae_load in ("eager", "background"):  # before anything loads, either way
        with pytest.raises(error, match=message):
            Cosmos3Pipeline.from_pretrained(broken, dtype=torch.float32, vae_load=vae_load)
    # the torch-free check (what farm validate runs) refuses it the same way
    with pytest.raises(error, match=message):
        check_sound_dir(broken, Cosmos3Config.from_json(broken / "transformer" / "config.json"))


def test_sound_tokenizer_weights_only_diffusers_can_refuse_fail_the_jobs_with_sound_and_only_them(
        root, pipe, tmp_path):
    broken = mismatch_weights(shutil.copytree(root, tmp_path / "broken"), "misshapen", "sound_tokenizer")
    message = r"broken/sound_tokenizer: the sound tokenizer did not build: CheckpointError: .*cannot load the sound"
    with pytest.raises(SoundTokenizerLoadError, match=message):  # loaded eagerly, the pipeline is refused
        Cosmos3Pipeline.from_pretrained(broken, dtype=torch.float32)

    background = Cosmos3Pipeline.from_pretrained(broken, dtype=torch.float32, vae_load="background")
    with pytest.raises(SoundTokenizerLoadError, match=message):  # waits for the build at its decode
        background(job("t2v", seed=2))
    steps = []
    with pytest.raises(SoundTokenizerLoadError, match=message):  # the build is known broken: before any step
        background(job("t2v", seed=2), callback=lambda i, n: steps.append(i))
    assert steps == []
    silent = background(job("t2v", seed=2, sound=False))  # the same transformer and VAE as the good checkpoint
    assert silent.sound is None
    np.testing.assert_array_equal(silent.frames, pipe(job("t2v", seed=2, sound=False)).frames)

    # The message's advice works: with the folder moved out, the checkpoint renders silent clips anywhere.
    with pytest.raises(SoundTokenizerLoadError, match="with the folder moved out the checkpoint renders silent clips"):
        background(job("t2v"))
    shutil.rmtree(broken / "sound_tokenizer")
    assert Cosmos3Pipeline.from_pretrained(broken, dtype=torch.float32)(job("t2v")).sound is None


def test_a_background_sound_tokenizer_is_built_after_from_pretrained_returns_and_waited_for_at_the_decode(
        root, pipe, monkeypatch):
    # Its build blocks until the job's last step: from_pretrained can only return without it, and a job that
    # waited for it before its steps would never get there.
    last_step, load = threading.Event(), SoundTokenizer.from_pretrained.__func__

    def load_after_the_steps(cls, *args, **kwargs):
        assert last_step.wait(timeout=60), "the job did not denoise before waiting for the sound tokenizer"
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(SoundTokenizer, "from_pretrained", classmethod(load_after_the_steps))
    background = Cosmos3Pipeline.from_pretrained(root, dtype=torch.float32, vae_load="background")
    assert background.load_timings["sound_tokenizer"] is None

    def on_step(i, n):
        if i == n - 1:
            last_step.set()

    out = background(job("t2v", seed=3, sound=True), callback=on_step)
    assert out.timings["vae_wait"] > 0 and background.load_timings["sound_tokenizer"] > 0
    expected = pipe(job("t2v", seed=3, sound=True))
    np.testing.assert_array_equal(out.sound, expected.sound)
    np.testing.assert_array_equal(out.frames, expected.frames)
    assert background(job("t2v")).timings["vae_wait"] == 0.0


# -- the GPU: graphs and static FP8 with sound on ------------------------------------------------------


@pytest.mark.gpu
def test_cuda_sound_render_with_graphs_equals_eager(root):
    request = job("t2v", seed=3)
    eager = Cosmos3Pipeline.from_pretrained(root, device="cuda", cuda_graphs=False)(request)
    graphed = Cosmos3Pipeline.from_pretrained(root, device="cuda")(request)
    assert np.array_equal(graphed.frames, eager.frames)
    assert np.array_equal(graphed.sound, eager.sound)


# -- static FP8 with sound on --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp8_root(root, tmp_path_factory):
    from cosmos3.checkpoint.fp8_export import export_fp8

    # ModelOpt calibrates on a render with sound: the sound tokens pass through every GEN projection too.
    return export_fp8(root, tmp_path_factory.mktemp("fp8") / "ckpt", [job("t2v", steps=2, sound=True)],
                      max_shard_size="64KB")


@pytest.fixture(scope="module")
def fp8_pipe(fp8_root):
    return Cosmos3Pipeline.from_pretrained(fp8_root, device="cpu", dtype=torch.float32)


def test_static_fp8_renders_sound_with_each_steps_precision_set_before_both_passes(pipe, fp8_pipe, monkeypatch):
    from cosmos3.quant import STATIC_FP8, W8A16

    gen_linear = fp8_pipe.model.step_controller.gen_linears[0]
    methods = []
    forward = fp8_pipe.model.forward

    def record(*args, **kwargs):
        assert kwargs["sound_latents"] is not None
        methods.append(gen_linear.method)
        return forward(*args, **kwargs)

    monkeypatch.setattr(fp8_pipe.model, "forward", record)
    out = fp8_pipe(job("t2v", steps=8))
    a16 = out.info["step_policy"]["a16_steps"]
    assert a16 == [0, 1, 2, 5, 6, 7]
    assert methods == [W8A16 if i in a16 else STATIC_FP8 for i in range(8) for _branch in ("cond", "uncond")]
    # The waveform stays a close copy of the fp32 render's (measured: 59 dB).
    assert measure.snr(pipe(job("t2v", steps=8)).sound, out.sound) > 40.0


@pytest.mark.gpu
def test_cuda_static_fp8_sound_render_with_graphs_equals_eager_and_stays_close_to_bf16(root, fp8_root):
    request = job("t2v", seed=3, steps=8)  # steps 0-2 and 5-7 W8A16, 3-4 W8A8: both graph modes replay
    eager = Cosmos3Pipeline.from_pretrained(fp8_root, device="cuda", cuda_graphs=False)(request)
    graphed = Cosmos3Pipeline.from_pretrained(fp8_root, device="cuda")(request)
    assert eager.info["precision"] == "fp8-static"
    assert np.array_equal(graphed.frames, eager.frames)
    assert np.array_equal(graphed.sound, eager.sound)
    bf16 = Cosmos3Pipeline.from_pretrained(root, device="cuda")(request)
    assert measure.snr(bf16.sound, graphed.sound) > 20.0


def test_building_the_sound_tokenizer_prints_no_warning(root):
    """Every FutureWarning an error, as a user's log would show it: torch's weight_norm deprecation, raised from
    diffusers' code at the build, does not reach the user."""
    code = ("import sys, warnings, torch\nwarnings.simplefilter('error', FutureWarning)\n"
            "from cosmos3.audio import SoundTokenizer\nfrom cosmos3.rules.checkpoint_header import check_sound_dir\n"
            "from cosmos3.rules.config import Cosmos3Config\nfrom pathlib import Path\nroot = Path(sys.argv[1])\n"
            "sound = check_sound_dir(root, Cosmos3Config.from_json(root / 'transformer' / 'config.json'))\n"
            "SoundTokenizer.from_pretrained(root / 'sound_tokenizer', sound.config, device=torch.device('cpu'))\n")
    built = subprocess.run([sys.executable, "-c", code, str(root)], cwd=Path(__file__).parents[2],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert "Warning" not in built.stderr
