"""The scenes the toy checkpoint learns from, and the pixel reader the render checks rely on.

The reader must be right on drawn scenes before it may judge renders: every drawn still reads back
its colours and position, every drawn clip its colours and direction.
"""

from __future__ import annotations

import numpy as np
import pytest

from toy import measure, scenes
from toy.layout import PROMPT_WORDS, write_tokenizer

DRAWN = 60  # random scenes per kind


@pytest.mark.parametrize("moving", [pytest.param(False, id="stills"), pytest.param(True, id="clips")])
def test_the_reader_reads_every_drawn_scene_right(moving):
    rng = np.random.default_rng(0)
    for _ in range(DRAWN):
        scene = scenes.random_scene(rng, moving=moving)
        frames = scenes.draw(scene, size=scenes.SIZE, frames=scenes.FRAMES if moving else 1, rng=rng)
        assert measure.matches(scene, measure.read(frames)), (scene, measure.read(frames))


def test_a_plain_frame_shows_no_shape():
    frame = np.full((scenes.SIZE, scenes.SIZE, 3), scenes.COLOURS["blue"], dtype=np.uint8)
    reading = measure.read(frame)
    assert (reading.background, reading.colour, reading.position) == ("blue", None, None)


def test_a_still_shape_does_not_read_as_motion():
    scene = scenes.Scene("circle", "red", "white", position="left")
    frames = scenes.draw(scene, size=scenes.SIZE, frames=scenes.FRAMES, rng=np.random.default_rng(0))
    assert measure.read(frames).motion is None


@pytest.mark.parametrize(
    "scene,caption",
    [
        pytest.param(scenes.Scene("circle", "red", "blue", position="left"),
                     "a red circle at the left on a blue background", id="still"),
        pytest.param(scenes.Scene("triangle", "white", "black", motion="up"),
                     "a white triangle moving up on a black background", id="clip-up"),
        pytest.param(scenes.Scene("square", "green", "yellow", motion="left"),
                     "a green square moving to the left on a yellow background", id="clip-left"),
    ],
)
def test_captions(scene, caption):
    assert scene.caption == caption
    assert scenes.scene_of(caption) == scene


def test_a_caption_no_scene_has_is_refused_by_name():
    caption = "a purple circle at the left on a blue background"
    with pytest.raises(ValueError, match=f"'{caption}' is no toy scene's caption"):
        scenes.scene_of(caption)


def test_every_caption_word_is_in_the_toy_vocabulary(tmp_path):
    from transformers import AutoTokenizer

    write_tokenizer(tmp_path, PROMPT_WORDS + scenes.CAPTION_WORDS, vocab_size=128)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    rng = np.random.default_rng(0)
    for moving in (False, True):
        for _ in range(20):
            ids = tokenizer(scenes.random_scene(rng, moving=moving).caption)["input_ids"]
            assert tokenizer.unk_token_id not in ids


@pytest.mark.parametrize("colour", list(scenes.PITCHES))
def test_a_clips_tone_reads_back_as_its_colour(colour):
    scene = scenes.Scene("circle", colour, "black" if colour != "black" else "white", motion="left")
    wave = scenes.tone(scene, 9000, 8000)
    assert measure.pitch(wave, 8000) == pytest.approx(scenes.PITCHES[colour], abs=1.0)
    assert measure.colour_of_pitch(measure.pitch(wave, 8000)) == colour


@pytest.mark.parametrize("motion,swells", [("right", True), ("down", True), ("left", False), ("up", False)])
def test_loudness_swells_moving_right_or_down_and_fades_moving_left_or_up(motion, swells):
    wave = scenes.tone(scenes.Scene("square", "red", "blue", motion=motion), 9000, 8000)
    first, last = np.abs(wave[:1000]).max(), np.abs(wave[-1000:]).max()
    assert (last > 2 * first) if swells else (first > 2 * last)
