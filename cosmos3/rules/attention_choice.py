"""The ``attention`` option, checked without torch (the farm's manifest calls this on a CPU-only head node).

``auto``: the fastest BF16 attention kernel the device has; ``bf16``: the same kernel, named explicitly
(kept distinct so a manifest states that it wants exact-precision attention even if ``auto`` changes);
``fp8``: FP8 attention with per-tensor scales computed from Q, K, V at every call (no calibration),
keys smoothed first. The steps a static FP8 checkpoint's step policy marks W8A16 run BF16 attention.
"""

from __future__ import annotations

from cosmos3.errors import ConfigError

ATTENTION_CHOICES = ("auto", "bf16", "fp8")


def attention_problem(value: object) -> str | None:
    """What is wrong with ``value`` as an ``attention`` choice (the rule, in words), or None."""
    if not isinstance(value, str) or value not in ATTENTION_CHOICES:
        return f"must be one of {', '.join(ATTENTION_CHOICES)}, got {value!r}"
    return None


def check_attention(value: object, where: str = "attention") -> str:
    """``value`` if it is one of ``ATTENTION_CHOICES``, else a ConfigError naming ``where``."""
    problem = attention_problem(value)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return value
