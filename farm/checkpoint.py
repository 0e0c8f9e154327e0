"""What the driver needs to know about a checkpoint, read without torch: is it static FP8, and its fingerprint.

`cosmos3/config.py` owns the full, strict config parsing (`uses_static_fp8()` among it). The driver may run
on a machine without torch, and `farm` must not import `cosmos3`, so this module keeps a small reader of
its own for the one predicate the manifest check needs; both follow reference §5.3.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

TRANSFORMER_CONFIG = Path("transformer") / "config.json"


def read_transformer_config(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's `transformer/config.json`.

    # Raises: OSError if it cannot be read, ValueError if it is not a JSON object.
    """
    data = json.loads((checkpoint / TRANSFORMER_CONFIG).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{TRANSFORMER_CONFIG} must hold a JSON object")
    return data


def uses_static_fp8(config: dict[str, Any]) -> bool:
    """True for a ModelOpt static FP8 checkpoint: FP8 weights *and* calibrated (non-dynamic) input scales.

    Same rule as `cosmos3.config.uses_static_fp8` (tests hold the two together): `quant_method: modelopt`,
    `FP8` in `quant_algo`, not weight-only, and every config group's `input_activations.dynamic` is false.
    """
    quant = config.get("quantization_config") or {}
    groups = list((quant.get("config_groups") or {}).values())
    static_input = bool(groups) and all((g.get("input_activations") or {}).get("dynamic") is False for g in groups)
    return (
        quant.get("quant_method") == "modelopt"
        and "FP8" in str(quant.get("quant_algo", ""))
        and static_input
        and not quant.get("weight_only", False)
    )


def distilled_steps(checkpoint: Path) -> int | None:
    """The step count of a distilled build's fixed schedule, or None for a base checkpoint.

    Same rule as `cosmos3.sampling`: `fixed_step_sampler_config.t_list` in the scheduler config, else
    `distilled_sigmas` in `modular_model_index.json`. Such builds bake guidance in (it must be 1.0).
    """
    for path, read in ((checkpoint / "scheduler" / "scheduler_config.json",
                        lambda d: (d.get("fixed_step_sampler_config") or {}).get("t_list")),
                       (checkpoint / "modular_model_index.json", lambda d: d.get("distilled_sigmas"))):
        try:
            sigmas = read(json.loads(path.read_text()))
        except (OSError, ValueError, AttributeError):
            continue
        if sigmas:
            return len(sigmas)
    return None


def fingerprint(checkpoint: Path) -> str:
    """A cheap identity for "the same checkpoint": every JSON file's bytes plus each weight file's name and size.

    Hashing the weights themselves would read gigabytes per plan; configs, indexes and shard sizes change
    whenever a checkpoint is re-exported or re-quantized. Paths are relative, so a moved copy keeps its identity.
    """
    digest = hashlib.sha256()
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        rel = path.relative_to(checkpoint).as_posix()
        if path.suffix == ".json":
            digest.update(f"{rel}\0".encode() + path.read_bytes() + b"\0")
        elif path.suffix == ".safetensors":
            digest.update(f"{rel}\0{path.stat().st_size}\0".encode())
    return digest.hexdigest()
