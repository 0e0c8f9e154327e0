"""Step-precision denoising: ``quantization_config.runtime.diffusion_step_policy`` (schema v1).

A ModelOpt FP8 video checkpoint names the denoising steps that run W8A16 (FP8 weights, 16-bit
activations) because its one calibrated activation scale fits them worst (docs/checkpoints.md §6). We
parse the policy strictly — a field we do not understand is an error, never a guess — and
apply it with the published semantics:

* step ``i`` of ``N`` runs W8A16 when ``i < first`` or ``i >= N - last``; a one-step schedule
  stays native (the warmup carve-out shared by TensorRT-LLM, SGLang and diffusers);
* the choice is made once per step, before both CFG passes, as a pure function of ``i, N``;
* a W8A16 step also runs BF16 attention when the model's attention is FP8 (edge steps are the
  precision-sensitive ones);
* UND linears follow ``reasoner`` once: the UND tower runs once per request and is cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosmos3.errors import ConfigError
from cosmos3.rules.config import QuantConfig
from cosmos3.rules.values import is_int

POLICY_KEY = "quantization_config.runtime.diffusion_step_policy"

_POLICY_FIELDS = {
    "schema_version", "type", "index_space", "scope", "default_mode",
    "first_steps", "last_steps", "overlap", "reasoner",
}
_CONSTANTS = {
    "type": "first_last_n",
    "index_space": "denoising_loop_iteration",
    "default_mode": "native",
    "overlap": "a16",
}


@dataclass(frozen=True)
class StepPolicy:
    first: int  # steps [0, first) run W8A16
    last: int  # steps [N - last, N) run W8A16
    reasoner: str  # "a16": UND linears always W8A16; "native": always W8A8
    source: str  # "checkpoint" or "override"

    def is_high_precision(self, step: int, num_steps: int) -> bool:
        if num_steps == 1:
            return False  # a one-step schedule is the warmup probe: keep the measured path native
        return step < self.first or step >= num_steps - self.last

    def a16_steps(self, num_steps: int) -> list[int]:
        return [i for i in range(num_steps) if self.is_high_precision(i, num_steps)]

    def describe(self) -> dict:
        return {"first_steps": self.first, "last_steps": self.last, "reasoner": self.reasoner, "source": self.source}


def parse_runtime(runtime: Any) -> StepPolicy | None:
    """``quantization_config.runtime`` -> the policy, or None when ``runtime`` is absent or null."""
    if runtime is None:
        return None
    if not isinstance(runtime, dict):
        raise ConfigError(f"quantization_config.runtime must be a mapping or null, got {type(runtime).__name__}")
    unknown = set(runtime) - {"diffusion_step_policy"}
    if unknown:
        raise ConfigError(f"quantization_config.runtime: unknown field(s) {sorted(unknown)}")
    if "diffusion_step_policy" not in runtime:
        raise ConfigError(f"{POLICY_KEY}: missing (runtime is present; set it or make runtime null)")
    return parse_policy(runtime["diffusion_step_policy"])


def parse_policy(policy: Any) -> StepPolicy:
    """Strict schema-v1 parsing; every error names the field and the value we accept."""
    if not isinstance(policy, dict):
        raise ConfigError(f"{POLICY_KEY} must be a mapping, got {type(policy).__name__}")
    unknown = set(policy) - _POLICY_FIELDS
    if unknown:
        raise ConfigError(f"{POLICY_KEY}: unknown field(s) {sorted(unknown)}")
    missing = _POLICY_FIELDS - set(policy)
    if missing:
        raise ConfigError(f"{POLICY_KEY}: missing field(s) {sorted(missing)}")
    version = policy["schema_version"]
    if not is_int(version) or version != 1:
        raise ConfigError(f"{POLICY_KEY}.schema_version: only the integer 1 is supported, got {version!r}")
    for name, expected in _CONSTANTS.items():
        if policy[name] != expected:
            raise ConfigError(f"{POLICY_KEY}.{name}: only {expected!r} is supported, got {policy[name]!r}")
    scope = policy["scope"]
    if not isinstance(scope, list) or not all(isinstance(s, str) for s in scope) or "transformer" not in scope:
        raise ConfigError(f"{POLICY_KEY}.scope: must be a list of strings containing 'transformer', got {scope!r}")
    if policy["reasoner"] not in ("a16", "native"):
        raise ConfigError(f"{POLICY_KEY}.reasoner: must be 'a16' or 'native', got {policy['reasoner']!r}")
    return StepPolicy(
        first=_window_count(policy["first_steps"], "first_steps"),
        last=_window_count(policy["last_steps"], "last_steps"),
        reasoner=policy["reasoner"],
        source="checkpoint",
    )


def _window_count(window: Any, name: str) -> int:
    where = f"{POLICY_KEY}.{name}"
    if not isinstance(window, dict) or set(window) != {"count", "mode"}:
        raise ConfigError(f"{where}: must be exactly {{count, mode}}, got {window!r}")
    if window["mode"] != "a16":
        raise ConfigError(f"{where}.mode: only 'a16' is supported, got {window['mode']!r}")
    count = window["count"]
    if not is_int(count) or count < 0:
        raise ConfigError(f"{where}.count: must be an integer >= 0, got {count!r}")
    return count


def resolve_policy(quant: QuantConfig | None, override: str | dict | None = "auto") -> StepPolicy | None:
    """The policy a render uses.

    ``"auto"``: the checkpoint's own policy (none if it has none: no knob of our own).
    ``"off"``: every step fully quantized. A dict ``{first, last[, reasoner]}``: an explicit
    override for experiments, recorded as such with each render.
    """
    checkpoint_policy = parse_runtime(quant.runtime) if quant is not None else None
    if override in (None, "auto"):
        return checkpoint_policy
    if override == "off":
        return None
    if isinstance(override, dict):
        unknown = set(override) - {"first", "last", "reasoner"}
        if unknown or not {"first", "last"} <= set(override):
            raise ConfigError(f"an override must be {{first, last[, reasoner]}}, got {override!r}")
        policy = {
            "first_steps": {"count": override["first"], "mode": "a16"},
            "last_steps": {"count": override["last"], "mode": "a16"},
        }
        reasoner = override.get("reasoner", checkpoint_policy.reasoner if checkpoint_policy else "native")
        parsed = parse_policy({**_published_shape(), **policy, "reasoner": reasoner})
        return StepPolicy(parsed.first, parsed.last, parsed.reasoner, source="override")
    raise ConfigError(f"must be 'auto', 'off' or {{first, last[, reasoner]}}, got {override!r}")


def _published_shape() -> dict:
    return {"schema_version": 1, "scope": ["transformer"], **_CONSTANTS}
