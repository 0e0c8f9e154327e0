"""manifests/demo.yaml: the README's demo asks the toy FP8 checkpoint for what it was trained on."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos3.prompt_tokenizer import PromptTokenizer
from farm import manifest
from toy import scenes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo() -> manifest.Manifest:
    return manifest.load(REPO / "manifests" / "demo.yaml")


def test_demo_is_a_dozen_stills_and_clips_with_a_seed_sweep_on_the_toy_fp8_checkpoint(demo):
    assert len(demo.jobs) == 12
    assert {job.request.task for job in demo.jobs} == {"t2i", "t2v"}
    assert any(job.key != job.id for job in demo.jobs), "no seed sweep"
    assert Path(demo.model.checkpoint) == (REPO / "checkpoints" / "toy" / "fp8").resolve()
    assert demo.model.static_fp8 and demo.model.options.step_precision == "auto"
    assert Path(demo.output_root) == REPO / "renders" / "demo"  # gitignored


def test_demo_jobs_ask_for_the_toy_training_size_frames_and_words(demo):
    tokenizer = PromptTokenizer.from_pretrained(REPO / "checkpoints" / "toy" / "fp8" / "text_tokenizer").tokenizer
    for job in demo.jobs:
        request = job.request
        assert (request.width, request.height) == (scenes.SIZE, scenes.SIZE), job.key
        if request.task == "t2v":
            assert (request.frames, request.fps) == (scenes.FRAMES, scenes.FPS), job.key
        assert tokenizer.unk_token_id not in tokenizer(request.prompt)["input_ids"], request.prompt
