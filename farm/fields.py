"""Checkers for manifest values: each takes the raw YAML value and returns the clean one or raises `Invalid`.

The message of `Invalid` is the rule, written to follow `<field>: ` in an error line.
"""

from __future__ import annotations

import collections
import re
from typing import Any, Callable

Checker = Callable[[Any], Any]

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # safe in file names and Ray task names
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


class Invalid(ValueError):
    """A value breaks its field's rule."""


def _got(value: Any) -> str:
    return f"got {value!r} ({type(value).__name__})"


def integer(minimum: int | None = None) -> Checker:
    def check(value: Any) -> int:
        # bool is an int in Python but `steps: yes` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"expected an integer, {_got(value)}")
        if minimum is not None and value < minimum:
            raise Invalid(f"must be at least {minimum}, got {value}")
        return value

    return check


def number(minimum: float, *, inclusive: bool = True) -> Checker:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(f"expected a number, {_got(value)}")
        if value < minimum or (not inclusive and value == minimum):
            raise Invalid(f"must be {'at least' if inclusive else 'above'} {minimum}, got {value}")
        return float(value)

    return check


def text(*, required: bool = False) -> Checker:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise Invalid(f"expected a string, {_got(value)}")
        if required and not value.strip():
            raise Invalid("must not be empty")
        return value

    return check


def choice(options: tuple[str, ...]) -> Checker:
    def check(value: Any) -> str:
        if value not in options:
            raise Invalid(f"must be one of {', '.join(options)}; got {value!r}")
        return value

    return check


def step_precision(value: Any) -> str:
    # YAML 1.1 reads a bare `off` as false; `step_precision: off` must still mean "off".
    if isinstance(value, bool):
        if value:
            raise Invalid("must be one of auto, off; got on/true")
        return "off"
    return choice(("auto", "off"))(value)


def identifier(value: Any) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise Invalid(f"{value!r} is not a valid id (letters, digits, '_', '.', '-'; starting with a letter or digit)")
    return value


def size(value: Any) -> tuple[int, int]:
    """`[width, height]`, both positive multiples of 16 (the VAE and patch size divide by 16)."""
    if not isinstance(value, list) or len(value) != 2:
        raise Invalid(f"expected [width, height], {_got(value)}")
    sides = [integer(1)(side) for side in value]
    for side in sides:
        if side % 16:
            raise Invalid(f"{side} is not a multiple of 16")
    return sides[0], sides[1]


def duration(value: Any) -> float:
    """Seconds: a number, or a string such as `90s`, `30m`, `1h30m`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    match = _DURATION.fullmatch(value) if isinstance(value, str) and value else None
    if not match or not any(match.groups()):
        raise Invalid(f"{value!r} is not a duration (seconds, or e.g. 90s, 30m, 1h30m)")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise Invalid(f"must be longer than 0, got {value!r}")
    return float(total)


def seeds(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise Invalid(f"expected a non-empty list of seeds, {_got(value)}")
    clean = tuple(integer(0)(seed) for seed in value)
    if len(set(clean)) < len(clean):
        repeated = min(seed for seed, count in collections.Counter(clean).items() if count > 1)
        raise Invalid(f"seed {repeated} is listed twice")
    return clean


def video_frames(value: int) -> int:
    """The Wan VAE encodes a first frame plus groups of 4, so a clip has 4k+1 frames."""
    if value % 4 != 1:
        lower = value - (value - 1) % 4
        raise Invalid(f"{value} is not 4k+1 frames (the VAE encodes 1 + 4k frames); use {lower} or {lower + 4}")
    return value
