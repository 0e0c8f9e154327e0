"""The toy trainer's batched forward computes what diffusers' Cosmos3OmniTransformer and our model compute.

If it did not, the checkpoint would be trained on one function and sampled with another. Each sample of
a batch must equal diffusers' own (one-sample) forward, and our inference model loaded from the saved
weights; the loss must train toward ``noise - x0``, the velocity UniPC's flow_prediction reads.
"""

from __future__ import annotations

import copy

import pytest
import torch

from cosmos3 import load_transformer
from testbed.reference import reference_forward, tiny_reference
from toy import flow

# (latent T, H, W, fps): an image, and a clip with fps-modulated temporal positions.
CASES = [pytest.param(1, 4, 6, None, id="t2i"), pytest.param(3, 4, 4, 8.0, id="t2v-fps-8")]
BATCH = 3
TEXT_LENGTH = 7


def batched(model):
    twin = copy.deepcopy(model)
    twin.set_attn_processor(flow.BatchedMoTAttnProcessor())
    return twin


def inputs(t, h, w, channels=4, vocab=64):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (BATCH, TEXT_LENGTH), generator=g)
    latents = torch.randn(BATCH, channels, t, h, w, generator=g)
    sigma = torch.tensor([0.9, 0.5, 0.05])
    return ids, latents, sigma


def predict_latents(model, ids, latents, sigma, fps):
    tokens, sound = flow.predict(model, ids, latents, sigma, fps)
    assert sound is None
    return flow.unpatchify(tokens, model.config.latent_patch_size, tuple(latents.shape[1:]))


@pytest.mark.parametrize("t,h,w,fps", CASES)
def test_each_sample_of_a_batch_matches_diffusers_forward(t, h, w, fps):
    ref = tiny_reference()
    ids, latents, sigma = inputs(t, h, w)
    with torch.no_grad():
        ours = predict_latents(batched(ref), ids, latents, sigma, fps)
        for i in range(BATCH):
            expected, _ = reference_forward(ref, ids[i], latents[i], 1000.0 * sigma[i].item(), fps=fps)
            torch.testing.assert_close(ours[i], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t,h,w,fps", CASES)
def test_batch_matches_our_inference_model(tmp_path, t, h, w, fps):
    ref = tiny_reference()
    ref.save_pretrained(tmp_path / "transformer", safe_serialization=True)
    model = load_transformer(tmp_path, dtype=torch.float32)
    ids, latents, sigma = inputs(t, h, w)
    with torch.no_grad():
        ours = predict_latents(batched(ref), ids, latents, sigma, fps)
    for i in range(BATCH):
        expected = model.velocity(ids[i], latents[i], 1000.0 * sigma[i].item(), fps=fps)
        torch.testing.assert_close(ours[i], expected, rtol=1e-4, atol=1e-5)


SOUND_DIM, SOUND_FRAMES = 8, 10


def test_a_clip_with_sound_matches_diffusers_forward_and_our_inference_model(tmp_path):
    ref = tiny_reference(sound_gen=True, sound_dim=SOUND_DIM)
    ref.save_pretrained(tmp_path / "transformer", safe_serialization=True)
    model = load_transformer(tmp_path, dtype=torch.float32)
    ids, latents, sigma = inputs(3, 4, 4)
    sound = torch.randn(BATCH, SOUND_DIM, SOUND_FRAMES, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        tokens, sound_velocity = flow.predict(batched(ref), ids, latents, sigma, 8.0, sound)
    vision = flow.unpatchify(tokens, ref.config.latent_patch_size, tuple(latents.shape[1:]))
    assert sound_velocity.shape == (BATCH, SOUND_DIM, SOUND_FRAMES)
    for i in range(BATCH):
        t = 1000.0 * sigma[i].item()
        expected, expected_sound = reference_forward(ref, ids[i], latents[i], t, fps=8.0, sound=sound[i])
        torch.testing.assert_close(vision[i], expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sound_velocity[i], expected_sound, rtol=1e-4, atol=1e-5)
        ours = model(ids[i], latents[i], t, fps=8.0, sound_latents=sound[i])
        torch.testing.assert_close(sound_velocity[i], ours.sound, rtol=1e-4, atol=1e-5)


def test_patchify_round_trips():
    latents = torch.randn(2, 4, 3, 4, 6)
    assert torch.equal(flow.unpatchify(flow.patchify(latents, 2), 2, (4, 3, 4, 6)), latents)


def test_loss_is_zero_for_the_model_that_predicts_noise_minus_x0(monkeypatch):
    """The target is ``noise - x0``: the sign UniPC's flow_prediction (x0 = x_s - s v) inverts."""
    ref = tiny_reference()
    ids, x0, sigma = inputs(1, 4, 4)
    noise = torch.randn_like(x0)

    sound_x0, sound_noise = torch.randn(BATCH, SOUND_DIM, SOUND_FRAMES), torch.randn(BATCH, SOUND_DIM, SOUND_FRAMES)

    def oracle(model, input_ids, noisy, s, fps, sound=None):
        # UniPC's flow_prediction recovers x0 = x_s - s v; with v = noise - x0 that is exact.
        assert torch.allclose(noisy - s.view(-1, 1, 1, 1, 1) * (noise - x0), x0, atol=1e-5)
        velocity = flow.patchify(noise - x0, model.config.latent_patch_size)
        if sound is None:
            return velocity, None
        assert torch.allclose(sound - s.view(-1, 1, 1) * (sound_noise - sound_x0), sound_x0, atol=1e-5)
        return velocity, sound_noise - sound_x0

    monkeypatch.setattr(flow, "predict", oracle)
    assert flow.loss(ref, ids, x0, sigma, noise, None).item() == 0.0
    assert flow.loss(ref, ids, x0, sigma, noise, None, (sound_x0, sound_noise)).item() == 0.0
