"""Checkers for what the farm itself reads from a manifest: each takes the raw YAML value and returns the
clean one or raises `Invalid`. Model and request fields are not checked here but by cosmos3.

The message of `Invalid` is the rule, written to follow `<field>: ` in an error line.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any

from cosmos3.rules.request import shown
from cosmos3.rules.values import is_int, is_number

Checker = Callable[[Any], Any]

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # safe in file names and Ray task names
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
# A job's timeout: the driver checks deadlines once a second and kills a job's worker past it, which then loads its
# model again, so a shorter timeout judges the farm rather than the job; a week bounds a job that never ends.
TIMEOUT_RANGE = (10.0, 7 * 24 * 3600.0)
MAX_RETRIES = 10  # each retry renders the whole job again
PRIORITY_RANGE = (-10**9, 10**9)  # a sort key; a wider spread sorts no differently


class Invalid(ValueError):
    """A value breaks its field's rule."""


def _got(value: Any) -> str:
    return f"got {value!r} ({type(value).__name__})"


def integer(minimum: int, maximum: int) -> Checker:
    def check(value: Any) -> int:
        if not is_int(value):  # `steps: yes` is a mistake, not 1
            raise Invalid(f"expected an integer, {_got(value)}")
        if not minimum <= value <= maximum:
            raise Invalid(f"{shown(value)} is outside the limits [{minimum:,}, {maximum:,}]")
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


def identifier(value: Any) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise Invalid(f"{value!r} is not a valid id (letters, digits, '_', '.', '-'; starting with a letter or digit)")
    return value


def pair(value: Any) -> tuple[Any, Any]:
    """`[width, height]`; the sides themselves are cosmos3's to check."""
    if not isinstance(value, list) or len(value) != 2:
        raise Invalid(f"expected [width, height], {_got(value)}")
    return value[0], value[1]


def timeout(value: Any) -> float:
    """Seconds within TIMEOUT_RANGE: a number, or a string such as `90s`, `30m`, `1h30m`."""
    seconds = _seconds(value)
    low, high = TIMEOUT_RANGE
    if not low <= seconds <= high:
        raise Invalid(f"{shown(value)} is outside the limits [{low:g}s, {high / 86400:g} days]")
    return float(seconds)


def _seconds(value: Any) -> float | int:
    """A number as written (an int of any size stays exact: float() of 1e400 overflows), or a duration string."""
    if is_number(value):
        return value
    match = _DURATION.fullmatch(value) if isinstance(value, str) and value else None
    if not match or not any(match.groups()):
        raise Invalid(f"{shown(value)} is not a duration (seconds, or e.g. 90s, 30m, 1h30m)")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


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
