"""Procedural scenes for the toy checkpoint: one coloured shape on a plain background, still or moving.

A scene's caption is what the model learns from ("a red circle at the left on a blue background",
"a red circle moving to the left on a blue background"); ``draw`` paints its pixels, anti-aliased by
supersampling so the VAE sees clean edges. Geometry is in fractions of the image side, so one scene
draws at any size.

A clip also sounds: a pure tone whose pitch names the shape's colour (``PITCHES``), swelling as the
shape moves right or down and fading as it moves left or up (``loudness``); ``tone`` is its waveform.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from cosmos3.rules.request import RenderRequest

# Named colours, far apart in RGB so a render's colours classify by nearest name. Kept inside
# [20, 235]: the VAE decoder clamps to [-1, 1], and a target on the clamp would get no gradient.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 215),
    "yellow": (235, 215, 45),
    "white": (235, 235, 235),
    "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle")
# Where a still shape sits: its centre as (x, y) fractions of the width and height (y grows downwards).
POSITIONS: dict[str, tuple[float, float]] = {
    "left": (0.22, 0.5),
    "right": (0.78, 0.5),
    "top": (0.5, 0.22),
    "bottom": (0.5, 0.78),
    "center": (0.5, 0.5),
}
# Which way a moving shape goes (a unit step in image axes) and the caption's words for it.
MOTIONS: dict[str, tuple[tuple[int, int], str]] = {
    "left": ((-1, 0), "to the left"),
    "right": ((1, 0), "to the right"),
    "up": ((0, -1), "up"),
    "down": ((0, 1), "down"),
}
# The tone of each shape colour. Multiples of 25 Hz, the sound latent rate: every latent frame then holds
# whole periods, so a frame's waveform does not depend on where the frame sits in the clip.
PITCHES: dict[str, float] = {"black": 300.0, "red": 400.0, "green": 500.0, "blue": 600.0, "yellow": 700.0,
                             "white": 800.0}
TONE_PEAK = 0.5  # amplitude of the tone at full loudness
QUIET, LOUD = 0.3, 1.0  # loudness at the start and end of a swell (reversed for a fade)
CAPTION_WORDS = ["a", "at", "the", "on", "background", "moving", "to", *COLOURS, *SHAPES, *POSITIONS, "up", "down"]

# What the toy checkpoint is trained on and renders: 96x96 (6x6 latents, 3x3 tokens), clips of 9
# frames (3 latent frames) at 8 fps; the sampler settings the demo and the tests use.
SIZE = 96
FRAMES = 9
FPS = 8.0
STEPS = 20
GUIDANCE = 4.0

RADIUS = 0.14  # a shape's half-size, as a fraction of the image side
TRAVEL = 0.5  # how far a clip's shape moves from its first frame to its last
JITTER = 0.04  # random offset of a shape's centre (per axis), so positions are regions, not points
SUPERSAMPLE = 2  # sub-pixels per pixel side: anti-aliased edges, cheap enough to draw every training batch


@dataclass(frozen=True)
class Scene:
    """One shape on a background; ``position`` for a still image, ``motion`` for a clip."""

    shape: str
    colour: str
    background: str
    position: str | None = None  # a key of POSITIONS
    motion: str | None = None  # a key of MOTIONS

    @property
    def caption(self) -> str:
        where = f"at the {self.position}" if self.motion is None else f"moving {MOTIONS[self.motion][1]}"
        return f"a {self.colour} {self.shape} {where} on a {self.background} background"


def random_scene(rng: np.random.Generator, *, moving: bool) -> Scene:
    colour, background = rng.choice(list(COLOURS), size=2, replace=False)
    shape = str(rng.choice(SHAPES))
    if moving:
        return Scene(shape, str(colour), str(background), motion=str(rng.choice(list(MOTIONS))))
    return Scene(shape, str(colour), str(background), position=str(rng.choice(list(POSITIONS))))


def _centres(scene: Scene, frames: int, rng: np.random.Generator) -> np.ndarray:
    """The shape's centre in each frame, ``[T, 2]`` (x, y) fractions: a still anchor, or a straight path."""
    jitter = rng.uniform(-JITTER, JITTER, size=2)
    if scene.motion is None:
        return np.tile(np.array(POSITIONS[scene.position]) + jitter, (frames, 1))
    step = np.array(MOTIONS[scene.motion][0], dtype=np.float64)
    start = 0.5 - step * TRAVEL / 2 + jitter
    progress = np.linspace(0.0, 1.0, frames)[:, None] if frames > 1 else np.zeros((1, 1))
    return start + progress * step * TRAVEL


def _coverage(shape: str, centre: np.ndarray, radius: float, size: int) -> np.ndarray:
    """Fraction of each pixel inside the shape, ``[size, size]`` in [0, 1]."""
    n = size * SUPERSAMPLE
    axis = (np.arange(n) + 0.5) / n  # sub-pixel centres, fractions of the side
    dx = axis[None, :] - centre[0]
    dy = axis[:, None] - centre[1]
    if shape == "circle":
        inside = dx**2 + dy**2 <= radius**2
    elif shape == "square":  # same area as the circle, so no shape is easier to see than another
        half = radius * np.sqrt(np.pi) / 2
        inside = (np.abs(dx) <= half) & (np.abs(dy) <= half)
    elif shape == "triangle":  # apex up; base 2r at dy = +r
        inside = (dy >= -radius) & (dy <= radius) & (np.abs(dx) <= (dy + radius) / 2)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    return inside.reshape(size, SUPERSAMPLE, size, SUPERSAMPLE).mean(axis=(1, 3))


def draw(scene: Scene, *, size: int, frames: int = 1, rng: np.random.Generator) -> np.ndarray:
    """The scene's pixels, ``uint8 [T, size, size, 3]``; ``rng`` picks the jitter of centre and size."""
    radius = RADIUS * rng.uniform(0.85, 1.15)
    background = np.array(COLOURS[scene.background], dtype=np.float64)
    colour = np.array(COLOURS[scene.colour], dtype=np.float64)
    out = np.empty((frames, size, size, 3), dtype=np.uint8)
    for i, centre in enumerate(_centres(scene, frames, rng)):
        alpha = _coverage(scene.shape, centre, radius, size)[..., None]  # [H, W, 1]
        out[i] = np.round(background * (1 - alpha) + colour * alpha).astype(np.uint8)
    return out


def loudness(scene: Scene, progress: np.ndarray) -> np.ndarray:
    """Loudness in [QUIET, LOUD] at ``progress`` (0 = first frame, 1 = last): it swells while the shape moves
    right or down and fades while it moves left or up."""
    dx, dy = MOTIONS[scene.motion][0]
    rising = np.clip(progress, 0.0, 1.0) if dx + dy > 0 else 1.0 - np.clip(progress, 0.0, 1.0)
    return QUIET + (LOUD - QUIET) * rising


def tone(scene: Scene, samples: int, rate: int) -> np.ndarray:
    """The clip's sound, float32 ``[samples]`` at ``rate`` Hz: the colour's pitch at its loudness."""
    t = np.arange(samples) / rate
    progress = t / (samples / rate)
    return (TONE_PEAK * loudness(scene, progress) * np.sin(2 * np.pi * PITCHES[scene.colour] * t)).astype(np.float32)


def scene_of(caption: str) -> Scene:
    """The scene whose caption is ``caption`` (a manifest job's prompt)."""
    for shape, colour, background in itertools.product(SHAPES, COLOURS, COLOURS):
        for where in [{"position": p} for p in POSITIONS] + [{"motion": m} for m in MOTIONS]:
            scene = Scene(shape, colour, background, **where)
            if scene.caption == caption:
                return scene
    raise ValueError(f"{caption!r} is no toy scene's caption")


def request(scene: Scene, *, seed: int, steps: int = STEPS, guidance: float = GUIDANCE) -> RenderRequest:
    """The render job of a scene's caption: t2i for a still, t2v for a clip, at the toy's size."""
    video = scene.motion is not None
    return RenderRequest(
        task="t2v" if video else "t2i", prompt=scene.caption, width=SIZE, height=SIZE,
        frames=FRAMES if video else 1, fps=FPS if video else None, steps=steps, guidance=guidance, seed=seed,
    )
