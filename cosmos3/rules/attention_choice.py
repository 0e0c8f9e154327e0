"""The ``attention`` option, checked without torch (the farm's manifest calls this on a CPU-only head node).

``auto``: the fastest BF16 attention kernel the device has; ``bf16``: the same kernel, named explicitly
(kept distinct so a manifest states that it wants exact-precision attention even if ``auto`` changes);
``fp8``: FP8 attention with per-tensor scales computed from Q, K, V at every call (no calibration),
keys smoothed first. The steps a static FP8 checkpoint's step policy marks W8A16 run BF16 attention.
``fp8-all-steps``: the same FP8 attention on those steps too; their linears stay W8A16. The policy is about the
linears' static activation scales, which misfit the edge steps; FP8 attention scales each call from its own Q, K, V,
so it has no calibration to misfit. It saves ~0.9 s of a Nano clip's edge step; the toy's measure of what it
costs is benchmarks/results/cpu-edge-attention.md.
"""

from __future__ import annotations

from cosmos3.errors import ConfigError

ATTENTION_CHOICES = ("auto", "bf16", "fp8", "fp8-all-steps")
FP8_CHOICES = ("fp8", "fp8-all-steps")  # the choices that run FP8 attention


def fp8_on_step(choice: str, w8a16_step: bool) -> bool:
    """Whether ``choice`` runs FP8 attention (GEN passes long enough for it) on a step; ``w8a16_step``: the
    checkpoint's step policy runs this step W8A16."""
    return choice == "fp8-all-steps" or (choice == "fp8" and not w8a16_step)


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
