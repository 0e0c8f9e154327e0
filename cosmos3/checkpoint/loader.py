"""``load_transformer``: checkpoint directory -> a ready Cosmos3Transformer on a device."""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos3.checkpoint.weights import CheckpointFiles, TensorDict, load_checkpoint
from cosmos3.layers.attention import GEN
from cosmos3.layers.linear import Linear
from cosmos3.precision import StepPrecisionController
from cosmos3.quant import W8A16, get_quant_method
from cosmos3.rules.checkpoint_header import fp8_modules, inspect
from cosmos3.rules.config import Cosmos3Config
from cosmos3.rules.load_options import LoadOptions, Precision, resolve
from cosmos3.timing import Clock
from cosmos3.transformer import Cosmos3Transformer


def load_transformer(path: str | Path, *, device: str | torch.device = "cpu", **options) -> Cosmos3Transformer:
    """Load ``path`` (checkpoint root or its ``transformer/`` dir) strictly and exactly.

    ``options`` are ``build_transformer``'s: ``dtype``, ``precision`` (``"auto"`` follows the
    checkpoint), ``attention`` (``"auto"``/``"bf16"``: the fastest BF16 kernel; ``"fp8"``: FP8
    attention where it is qualified, see cosmos3/layers/attention_kernels.py), ``fp8_accumulation``
    (``"fast"`` or ``"fp32"``: how FP8 GEMMs sum on the GPU, cosmos3.rules.load_options), ``step_precision``
    (``"auto"``: the checkpoint's diffusion_step_policy, if any; ``"off"``; or ``{"first": n, "last": m}``
    to experiment) and ``parallel`` (every axis 1: ``cosmos3.rules.load_options.ONE_GPU``).
    """
    facts = inspect(path)  # the checks `farm validate` runs, from the headers alone
    files = CheckpointFiles(facts.directory, device=device, headers=facts.tensors)
    return build_transformer(facts.config, files, device=device, **options)


def build_transformer(
    config: Cosmos3Config,
    tensors: CheckpointFiles | TensorDict,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    precision: Precision = "auto",
    attention: str = "auto",
    fp8_accumulation: str = "fast",
    step_precision: str | dict | None = "auto",
    parallel: dict[str, int] | None = None,
) -> Cosmos3Transformer:
    """The model for ``config`` filled from ``tensors`` (files, or a dict in memory)."""
    # The same torch-free check the farm runs on a manifest's model section.
    options = LoadOptions(precision, step_precision, parallel, attention, fp8_accumulation)
    resolved = resolve(config, options)
    precision, policy = resolved.precision, resolved.policy
    fp8 = fp8_modules(config, tensors.headers, tensors.directory) if precision == "fp8-static" else frozenset()
    clock = Clock(device)
    started = clock()
    with torch.device(device):
        model = Cosmos3Transformer(config, precision=precision, dtype=dtype, fp8_modules=fp8, attention=attention,
                                   fp8_accumulation=fp8_accumulation)
    built = clock()
    # Before loading: an unusable attention choice fails fast, and a kernel library's JIT build happens here.
    model.attention.check_device(device)
    kernels_ready = clock()
    load_checkpoint(model, tensors)
    model.finish_loading()
    # Seconds to allocate the model and to ready its attention kernels, seconds and bytes to fill it from the
    # checkpoint (worker start figures).
    model.load_report = {"build": built - started, "attention_kernels": kernels_ready - built,
                         "read": clock() - kernels_ready, "bytes": tensors.bytes_read}
    if policy is not None:
        gen, und = tower_linears(model)
        w8a8 = get_quant_method(precision, fp8_accumulation)
        model.step_controller = StepPrecisionController(model.step_precision, gen, und, policy, w8a8, W8A16)
    return model.eval()


def tower_linears(model: Cosmos3Transformer) -> tuple[list[Linear], list[Linear]]:
    """The static-FP8 linears the step policy drives: (GEN, UND); high-precision modules excluded.

    UND is the reasoner tower's projections (``to_q/k/v/out``, ``mlp``). Everything else that
    runs W8A8 reads the GEN stream only: the GEN tower, and proj_in, proj_out, time_embedder and
    the audio projections when the checkpoint quantized them (vLLM-Omni and TensorRT-LLM switch
    every static-FP8 linear the same way).
    """
    gen_names = {GEN.q, GEN.k, GEN.v, GEN.out, "mlp_moe_gen"}
    gen, und = [], []
    for name, module in model.named_modules():
        if isinstance(module, Linear) and module.quant_method.shares_input_quant:
            is_und = name.startswith("layers.") and not set(name.split(".")) & gen_names
            (und if is_und else gen).append(module)
    return gen, und
