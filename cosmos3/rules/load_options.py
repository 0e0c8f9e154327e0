"""How a checkpoint is asked to load (precision, step precision, parallel axes, attention, FP8 accumulation), checked
without torch.

``cosmos3.checkpoint.loader`` calls ``resolve()`` before it builds a model; the farm calls ``problems()`` on a
manifest's ``model`` section, so both refuse the same options with the same words. Each problem names
the option it is about (``precision``, ``step_precision``, ``parallel.<axis>``, ``attention``, ``fp8_accumulation``,
``cache[.<parameter>]``), or ``checkpoint`` when the checkpoint itself cannot be run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from cosmos3.errors import ConfigError, FieldProblem
from cosmos3.rules.attention_choice import attention_problem
from cosmos3.rules.cache_options import DEFAULT_CACHE, cache_problems
from cosmos3.rules.config import Cosmos3Config, uses_static_fp8
from cosmos3.rules.step_precision import StepPolicy, resolve_policy
from cosmos3.rules.values import is_int

Precision = Literal["auto", "bf16", "fp8-dynamic", "fp8-static"]  # "auto" runs what the checkpoint holds
PRECISIONS: tuple[str, ...] = get_args(Precision)  # what a caller may ask for
RUN_PRECISIONS = tuple(p for p in PRECISIONS if p != "auto")  # what a load runs (Resolved.precision)
PARALLEL_AXES = ("tp_size", "ulysses_size", "cfg_size", "cp_size", "parallel_vae_size")
# A model runs on one GPU: no axis is built (a static-FP8 Super fits one H200, docs/models.md), and a farm worker
# owns exactly one GPU (num_gpus=1). farm validate and from_pretrained refuse any axis above 1 in these words.
ONE_GPU = "cosmos3 runs a model on one GPU (no parallel axis is built)"
# How an FP8 GEMM sums its products on the GPU (torch._scaled_mm's use_fast_accum). "fast": in the tensor cores'
# accumulator, as torchao's FP8 inference configs and vLLM's Hopper FP8 kernels do; "fp32": partial sums promoted
# to fp32 registers every K block (cuBLAS's careful mode): 10-20x less accumulation error, still far under the e4m3
# quantization's own, and a Nano still 1.048x slower on the H200
# (benchmarks/results/h200-fp8.md). The CPU path always sums in fp32.
FP8_ACCUMULATIONS = ("fast", "fp32")


@dataclass(frozen=True)
class LoadOptions:
    """What a caller chooses when loading a checkpoint; the keyword arguments of ``load_transformer``.

    A new option is a field here plus its rule in ``problems()``: the farm reads its manifest's
    ``model`` keys from these fields, so it validates and passes the option on without a change.
    """

    precision: Precision = "auto"
    step_precision: Any = "auto"  # "auto" (the checkpoint's policy), "off", or {first, last[, reasoner]}
    parallel: dict[str, int] | None = None  # every axis 1: a model runs on one GPU (ONE_GPU)
    attention: str = "auto"  # ATTENTION_CHOICES (cosmos3.rules.attention_choice); the device is checked at load
    fp8_accumulation: str = "fast"  # FP8_ACCUMULATIONS; FP8 GEMMs only (a BF16 run has none)
    cache: Any = DEFAULT_CACHE  # the step cache: off | seacache | {method: seacache, ...} (cosmos3.rules.cache_options)


@dataclass(frozen=True)
class Resolved:
    precision: str  # what runs: one of RUN_PRECISIONS
    policy: StepPolicy | None


def _precision(config: Cosmos3Config, precision: Any) -> tuple[str | None, list[FieldProblem]]:
    """``auto`` follows the checkpoint; combinations that would quantize twice or run untested are refused."""
    if precision not in PRECISIONS:
        return None, [("precision", f"{precision!r} is not one of {', '.join(PRECISIONS)}")]
    if uses_static_fp8(config):
        if precision in ("bf16", "fp8-dynamic"):
            return None, [("precision", f"{precision!r} on a ModelOpt static FP8 checkpoint would re-quantize "
                                        "calibrated weights (forced dynamic quantization on a split GatedMLP); "
                                        "use 'auto'")]
        return "fp8-static", []
    if config.quantization is not None:
        q = config.quantization
        return None, [("checkpoint", f"quantization_config quant_method={q.quant_method!r} "
                                     f"quant_algo={q.quant_algo!r} (static inputs: {q.static_input}) is not "
                                     "supported; only ModelOpt static FP8 checkpoints are")]
    if precision == "fp8-static":
        return None, [("precision", "'fp8-static' needs a ModelOpt static FP8 checkpoint; this one is unquantized")]
    return ("bf16" if precision == "auto" else precision), []


def parallel_problems(parallel: Any) -> list[FieldProblem]:
    """The one-GPU rule, for the library and the farm alike: the axes are named so that a caller who asks for
    sharding hears it is not built, instead of a model that loads and runs on one GPU without a word."""
    if parallel is None:
        return []
    if not isinstance(parallel, dict):
        return [("parallel", f"expected a mapping of {', '.join(PARALLEL_AXES)}, got {type(parallel).__name__}")]
    problems = []
    for axis, size in parallel.items():
        where = f"parallel.{axis}"
        if axis not in PARALLEL_AXES:
            problems.append((where, f"unknown axis (one of {', '.join(PARALLEL_AXES)})"))
        elif not is_int(size) or size < 1:
            problems.append((where, f"{size!r} is not a whole number >= 1"))
        elif size != 1:
            problems.append((where, f"{ONE_GPU}; got {where}={size} (set it to 1)"))
    return problems


def problems(config: Cosmos3Config, options: LoadOptions) -> list[FieldProblem]:
    """Every problem of loading ``config``'s checkpoint with ``options``, as (option, message) pairs."""
    return _check(config, options)[1]


def resolve(config: Cosmos3Config, options: LoadOptions) -> Resolved:
    """The precision and step policy a load runs; raises ``ConfigError`` listing every problem."""
    resolved, found = _check(config, options)
    if found:
        raise ConfigError.listing("load options", found)
    return resolved


def _check(config: Cosmos3Config, options: LoadOptions) -> tuple[Resolved | None, list[FieldProblem]]:
    precision, found = _precision(config, options.precision)
    found += parallel_problems(options.parallel)
    if (problem := attention_problem(options.attention)) is not None:
        found.append(("attention", problem))
    if options.fp8_accumulation not in FP8_ACCUMULATIONS:
        found.append(("fp8_accumulation", f"must be one of {', '.join(FP8_ACCUMULATIONS)}, "
                                          f"got {options.fp8_accumulation!r}"))
    found += cache_problems(options.cache)
    # A bad policy inside the checkpoint names the checkpoint; a bad override names step_precision.
    for field, read in (("checkpoint", lambda: resolve_policy(config.quantization, "auto")),
                        ("step_precision", lambda: resolve_policy(config.quantization, options.step_precision))):
        try:
            policy = read()
        except ConfigError as err:
            return None, [*found, (field, str(err))]
    if policy is not None and precision not in (None, "fp8-static"):
        found.append(("step_precision", "step precision applies to static FP8 checkpoints only; set it to 'off'"))
    return (None if found else Resolved(precision, policy)), found
