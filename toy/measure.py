"""Read a render back from its pixels: background colour, shape colour, where the shape is, where it goes;
and from its sound: the colour its tone's pitch names. Compare two renders: PSNR of frames, SNR of waveforms.

Independent of any model: every pixel is classified to the nearest named colour of
``toy.scenes.COLOURS``; the background is the commonest class, the shape the commonest of the
rest; the shape's centroid gives its position (nearest named anchor) and, across frames, its motion.
A waveform's pitch is the peak of its (Hann-windowed) spectrum; its colour the nearest of ``PITCHES``.
Comparisons sum in float64: a float32 sum over a clip's samples would round away the small differences measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toy.scenes import COLOURS, MOTIONS, PITCHES, POSITIONS, Scene

NAMES = list(COLOURS)
PALETTE = np.array([COLOURS[n] for n in NAMES], dtype=np.float32)  # [K, 3]
MIN_SHAPE_SHARE = 0.01  # fewer shape pixels than this share of the frame: no shape was drawn
MIN_TRAVEL = 0.15  # a centroid moving less than this fraction of the side is not moving


@dataclass(frozen=True)
class Reading:
    background: str
    colour: str | None  # None when no shape is visible
    centroids: tuple[tuple[float, float] | None, ...]  # (x, y) fractions per frame; None: no shape there

    @property
    def position(self) -> str | None:
        """The named anchor nearest the first frame's centroid."""
        first = self.centroids[0]
        if first is None:
            return None
        return min(POSITIONS, key=lambda name: np.hypot(*np.subtract(POSITIONS[name], first)))

    @property
    def motion(self) -> str | None:
        """The direction from the first to the last centroid, if it moved at least MIN_TRAVEL."""
        first, last = self.centroids[0], self.centroids[-1]
        if first is None or last is None:
            return None
        dx, dy = np.subtract(last, first)
        if max(abs(dx), abs(dy)) < MIN_TRAVEL:
            return None
        step = (int(np.sign(dx)), 0) if abs(dx) >= abs(dy) else (0, int(np.sign(dy)))
        return next(name for name, (unit, _) in MOTIONS.items() if unit == step)


def classify(frames: np.ndarray) -> np.ndarray:
    """``uint8 [..., 3]`` -> index into NAMES of each pixel's nearest named colour, ``[...]``."""
    distance = ((frames[..., None, :].astype(np.float32) - PALETTE) ** 2).sum(-1)  # [..., K]
    return distance.argmin(-1)


def _centroid(mask: np.ndarray) -> tuple[float, float] | None:
    """``bool [H, W]`` -> (x, y) centre of mass as fractions of the side, None if too few pixels."""
    if mask.mean() < MIN_SHAPE_SHARE:
        return None
    ys, xs = np.nonzero(mask)
    return ((xs.mean() + 0.5) / mask.shape[1], (ys.mean() + 0.5) / mask.shape[0])


def read(frames: np.ndarray) -> Reading:
    """``uint8 [T, H, W, 3]`` (or one ``[H, W, 3]`` image) -> what it shows."""
    frames = frames if frames.ndim == 4 else frames[None]
    classes = classify(frames)  # [T, H, W]
    counts = np.bincount(classes.ravel(), minlength=len(NAMES))
    background = int(counts.argmax())
    counts[background] = 0
    shape = int(counts.argmax())
    if counts[shape] < MIN_SHAPE_SHARE * classes.size:
        return Reading(NAMES[background], None, tuple(None for _ in classes))
    return Reading(NAMES[background], NAMES[shape], tuple(_centroid(c == shape) for c in classes))


def matches(scene: Scene, reading: Reading) -> bool:
    """The render shows the scene's colours and its position (still) or direction (clip)."""
    where = reading.position == scene.position if scene.motion is None else reading.motion == scene.motion
    return reading.background == scene.background and reading.colour == scene.colour and where


def pitch(samples: np.ndarray, rate: int) -> float:
    """The strongest frequency (Hz) of a mono waveform ``[N]``, or of the channels' mean ``[channels, N]``."""
    mono = samples.mean(0) if samples.ndim == 2 else samples
    spectrum = np.abs(np.fft.rfft((mono - mono.mean()) * np.hanning(len(mono))))
    return float(np.fft.rfftfreq(len(mono), 1.0 / rate)[spectrum.argmax()])


def colour_of_pitch(hz: float) -> str:
    """The colour whose tone is nearest ``hz``."""
    return min(PITCHES, key=lambda name: abs(PITCHES[name] - hz))


def mse(a: np.ndarray, b: np.ndarray) -> float:
    """Mean squared difference of two arrays of one shape (uint8 frames or float waveforms)."""
    return float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def decibels(error: float) -> float:
    """PSNR (dB) of uint8 frames whose mean squared error is ``error``; inf when they are identical."""
    return float("inf") if error == 0 else float(10 * np.log10(255.0**2 / error))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR (dB) of uint8 frames ``a`` against ``b`` (any one shape, e.g. ``[T, H, W, 3]``)."""
    return decibels(mse(a, b))


def snr(reference: np.ndarray, signal: np.ndarray) -> float:
    """SNR (dB) of waveform ``signal`` against ``reference`` (one shape, e.g. ``[channels, N]``): the reference's
    power over the power of their difference; inf when they are identical."""
    reference = reference.astype(np.float64)
    noise = float(np.sum((signal.astype(np.float64) - reference) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(reference**2) / noise))
