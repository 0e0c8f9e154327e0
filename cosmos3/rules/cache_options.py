"""The step cache a render runs (``cache: off | seacache | {method: seacache, threshold, ...}``), checked without
torch.

One rule for the loader and ``farm validate``: ``cosmos3.rules.load_options`` calls ``cache_problems`` on its ``cache``
option, ``Cosmos3Pipeline`` calls ``parse_cache``. Each problem names ``cache`` or ``cache.<parameter>``.
The parameters are diffusers' ``SeaCacheConfig`` (hooks/sea_cache.py), spelled as a manifest reads them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from cosmos3.errors import ConfigError, FieldProblem
from cosmos3.rules.values import is_int, is_number, is_real, yaml_off

METHODS = ("off", "seacache")


@dataclass(frozen=True)
class SeaCacheSettings:
    """SeaCache's knobs; the defaults are the ones Cosmos3's recipes publish (diffusers' ``SeaCacheConfig``)."""

    threshold: float = 0.25  # accumulated relative-L1 change of the indicator that forces a computed step
    max_consecutive: int = 2  # cached steps in a row at most (0: no limit)
    retention_steps: int = 1  # leading steps always computed
    end_steps: int = 1  # trailing steps always computed
    residual_order: int = 1  # 0: reuse the last residual; 1: extrapolate linearly from the last two
    power_exp: float = 3.0  # exponent of the clean-signal power prior 1/|f|^p of the indicator's filter

    def describe(self) -> dict:
        return {"method": "seacache", **asdict(self)}


# The default: SeaCache as published (benchmarks/results/cpu-step-cache.md measures it against uncached renders).
DEFAULT_CACHE: Any = "seacache"

_WHOLE = ("max_consecutive", "retention_steps", "end_steps")
_REAL = ("threshold", "power_exp")  # read as floats: `power_exp: 3` is the published 3.0
# Bounds that keep a typo from reading as a setting: no schedule has more steps than a scheduler's 1,000 training
# timesteps, and a budget above 10 (40 times the published one) is no setting anyone has measured.
MAX_WHOLE = 1000
MAX_THRESHOLD = 10.0


def _parameter_problem(name: str, value: Any) -> str | None:
    if name in _WHOLE:
        if not is_int(value) or not 0 <= value <= MAX_WHOLE:
            return f"{value!r} is not a whole number in [0, {MAX_WHOLE}]"
        return None
    if name == "residual_order":
        return None if is_real(value) and value in (0, 1) else f"{value!r} is not 0 or 1"
    if not is_number(value):
        return f"{value!r} is not a finite number"
    if name == "threshold" and not 0 <= value <= MAX_THRESHOLD:
        return (f"{value!r} is not in [0, {MAX_THRESHOLD:g}]: a budget of relative change (0.25 as published; "
                f"larger caches more steps)")
    if name == "power_exp" and value <= 0:
        return f"{value!r} is not > 0 (3.0 as published for video)"
    return None


def _read(value: Any) -> tuple[SeaCacheSettings | None, list[FieldProblem]]:
    if yaml_off(value) == "off":
        return None, []
    if value == "seacache":
        return SeaCacheSettings(), []
    if not isinstance(value, dict):
        return None, [("cache", f"must be one of {', '.join(METHODS)} or {{method: seacache, threshold: ..., "
                                f"max_consecutive: ...}}, got {value!r}")]
    method = value.get("method")
    if yaml_off(method) == "off":
        return None, [("cache.method", "off takes no parameters: write `cache: off` alone for no step cache")]
    if method != "seacache":
        return None, [("cache.method", f"{method!r}: a cache with parameters names its method: seacache")]
    known = {f.name for f in fields(SeaCacheSettings)}
    found = [(f"cache.{name}", f"unknown parameter (one of method, {', '.join(sorted(known))})")
             for name in value if name not in known | {"method"}]
    params = {name: v for name, v in value.items() if name in known}
    found += [(f"cache.{name}", problem) for name, v in params.items()
              if (problem := _parameter_problem(name, v)) is not None]
    if found:
        return None, found
    return SeaCacheSettings(**{name: _as_read(name, v) for name, v in params.items()}), found


def _as_read(name: str, value: int | float) -> int | float:
    """A checked parameter as its field's type, in one spelling: `power_exp: 3` is 3.0, `residual_order: 0.0` is 0,
    and -0.0 is 0.0 (equal, but written apart in a config hash)."""
    return float(value) + 0.0 if name in _REAL else int(value)


# Where the step cache runs: stills and clips alike (a distilled schedule's four re-noised steps never run it: the
# pipeline's rule). Decided per task from what a cached step saves, measured: on the toy the default caches 40% of a
# still's steps at PSNR median 50.5, min 42.8 dB (every prompt shown) and 35% of a clip's at min 53.8 dB
# (benchmarks/results/cpu-step-cache.md); on the H200 a cached step costs 19-20% of a graphed computed still step and
# 0.23% of a clip's (h200-step-cache.md). So a still's denoising falls by ~32% (40% of its steps at a fifth of their
# cost; 1.44 -> 1.02 s with 20 of 50 cached) and a clip's by ~35%: both pay.
#
# The config hash records a still's setting under STILLS_KEY, apart from a clip's: a sidecar whose still hashed the
# bare default's identity is a still that computed every step, and it is not done (README, "Upgrade notes").
STILLS_KEY = "stills"


def hashed_cache(value: Any, frames: int) -> Any:
    """What a job's config hash records of its ``cache`` option for a render of ``frames`` frames: its identity
    (``cache_identity``), a still's under STILLS_KEY. Raises ``ConfigError`` as ``parse_cache``."""
    identity = cache_identity(value)
    return identity if frames > 1 else {STILLS_KEY: identity}


def cache_problems(value: Any) -> list[FieldProblem]:
    """Every problem of the ``cache`` option ``value``, as (field, message) pairs."""
    return _read(value)[1]


def cache_identity(value: Any) -> Any:
    """The one spelling of a valid ``cache`` option, for hashing: ``off``; ``seacache`` for the published settings
    however they are written (``seacache``, ``{method: seacache}``, every published value written out); else
    every setting written out (``SeaCacheSettings.describe``). Raises ``ConfigError`` as ``parse_cache``."""
    settings = parse_cache(value)
    if settings is None:
        return "off"
    return "seacache" if settings == SeaCacheSettings() else settings.describe()


def parse_cache(value: Any) -> SeaCacheSettings | None:
    """The settings ``value`` asks for (None: no step cache); raises ``ConfigError`` listing every problem."""
    settings, found = _read(value)
    if found:
        raise ConfigError.listing("load options", found)
    return settings
