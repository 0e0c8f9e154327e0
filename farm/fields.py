"""Checkers for what the farm itself reads from a manifest: each takes the raw YAML value and returns the
clean one or raises `Invalid`. Model and request fields are not checked here but by cosmos3.

The message of `Invalid` is the rule, written to follow `<field>: ` in an error line.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any

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


def text(*, required: bool = False) -> Checker:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise Invalid(f"expected a string, {_got(value)}")
        if required and not value.strip():
            raise Invalid("must not be empty")
        return value

    return check


def anything(value: Any) -> Any:
    """A value checked elsewhere (by cosmos3), passed on as written."""
    return value


def yaml_off(value: Any) -> Any:
    """YAML 1.1 reads a bare `off` as false: `step_precision: off` must still mean "off"."""
    return "off" if value is False else value


def identifier(value: Any) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise Invalid(f"{value!r} is not a valid id (letters, digits, '_', '.', '-'; starting with a letter or digit)")
    return value


def pair(value: Any) -> tuple[Any, Any]:
    """`[width, height]`; the sides themselves are cosmos3's to check."""
    if not isinstance(value, list) or len(value) != 2:
        raise Invalid(f"expected [width, height], {_got(value)}")
    return value[0], value[1]


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


OUTPUT_FORMATS = ("png", "mp4", "wav")


def outputs(value: Any) -> tuple[str, ...]:
    """The files a job publishes: a non-empty list of distinct formats (png, mp4, wav)."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise Invalid(f"expected a list of formats ({', '.join(OUTPUT_FORMATS)}), {_got(value)}")
    unknown = [v for v in value if v not in OUTPUT_FORMATS]
    if unknown:
        raise Invalid(f"{unknown[0]!r} is not a format; use {', '.join(OUTPUT_FORMATS)}")
    if len(set(value)) < len(value):
        raise Invalid(f"{next(v for v in value if value.count(v) > 1)} is listed twice")
    return tuple(value)


def seeds(value: Any) -> tuple[Any, ...]:
    """A sweep: a non-empty list without repeats; each seed is cosmos3's to check."""
    if not isinstance(value, list) or not value:
        raise Invalid(f"expected a non-empty list of seeds, {_got(value)}")
    counts = collections.Counter(map(repr, value))  # linear, and repr is hashable for any YAML value
    if len(counts) < len(value):
        repeated = next(seed for seed in value if counts[repr(seed)] > 1)
        raise Invalid(f"seed {repeated} is listed twice")
    return tuple(value)
