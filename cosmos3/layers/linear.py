"""A Linear that owns its tensors and delegates the maths to a quant method."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cosmos3.ops import FP8
from cosmos3.quant.base import LinearMethod
from cosmos3.quant.step_precision import StepPrecision


class Linear(nn.Module):
    """``[..., in_features] -> [..., out_features]``.

    A fused Linear (BF16 / dynamic FP8 topology) concatenates several checkpoint projections
    along the output dim; ``shard_keys`` names them (e.g. ``("to_q", "to_k", "to_v")``) and
    ``shard_sizes`` gives their output widths, so the loader alone translates names.

    ``quant_method`` is how the layer computes as its checkpoint stores it. A layer a step policy drives also has an
    ``a16_method`` (W8A16) and the model's ``StepPrecision``: ``method`` is the one the step runs now.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int | Sequence[int],
        *,
        quant_method: LinearMethod,
        dtype: torch.dtype,
        bias: bool = False,
        shard_keys: Sequence[str] | None = None,
    ):
        super().__init__()
        sizes = tuple(out_features) if isinstance(out_features, Sequence) else (out_features,)
        if shard_keys is not None and len(shard_keys) != len(sizes):
            raise ValueError(f"{len(shard_keys)} shard keys for {len(sizes)} shard sizes")
        self.in_features = in_features
        self.out_features = sum(sizes)
        self.shard_sizes = sizes
        self.is_fused = shard_keys is not None and len(shard_keys) > 1
        # An unfused layer has one shard, named by its own checkpoint key ("" = the layer itself).
        self.shard_keys = tuple(shard_keys) if shard_keys is not None else ("",)
        self.has_bias = bias
        self.quant_method = quant_method
        self.a16_method: LinearMethod | None = None
        self.step_precision: StepPrecision | None = None
        quant_method.create_weights(self, dtype)

    def drive_by(self, step_precision: StepPrecision, a16_method: LinearMethod) -> None:
        """Compute with ``a16_method`` on the steps ``step_precision`` runs at 16 bits (set once, at load)."""
        self.step_precision, self.a16_method = step_precision, a16_method

    @property
    def method(self) -> LinearMethod:
        """The method this step computes with."""
        a16 = self.step_precision is not None and self.step_precision.a16
        return self.a16_method if a16 else self.quant_method

    @property
    def dequantized(self) -> torch.Tensor | None:
        """The weight in 16 bits while the model holds it dequantized for W8A16 passes (W8A16 reads it), else None."""
        return None if self.step_precision is None else self.step_precision.held_weight(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.shard_sizes}, method={type(self.method).__name__}"


def shared_input_scale(linears: Sequence[Linear]) -> torch.Tensor | None:
    """The FP8 scale ``[1]`` a group of projections that read one input (shared QKV or gate/up) wants it in, so
    its producer (a norm, swiglu) can emit FP8 straight; None unless every member runs static W8A8 (a 16-bit
    step, an ignored high-precision member, a fused topology). One identical input_scale per group is a
    load-time invariant (checked in ``validate_shared_input_scales``)."""
    if all(linear.method.shares_input_quant for linear in linears):
        first = linears[0]
        return first.method.fp8_output_scale(first)
    return None


def quantize_shared_input(x: torch.Tensor, linears: Sequence[Linear]) -> torch.Tensor:
    """``x`` quantized once for a group that reads it (see ``shared_input_scale``); an FP8 ``x`` (its producer
    quantized it) or a group that wants 16-bit passes through."""
    if x.dtype == FP8 or shared_input_scale(linears) is None:
        return x
    first = linears[0]
    return first.method.quantize_input(first, x)


def validate_shared_input_scales(linears: dict[str, Linear], where: str) -> None:
    """A sharing group must carry one identical calibrated input_scale; run once after loading."""
    from cosmos3.errors import CheckpointError

    static = {name: linear for name, linear in linears.items() if linear.quant_method.shares_input_quant}
    if len(static) < 2:
        return
    values = {name: linear.input_scale.item() for name, linear in static.items()}
    if len(set(values.values())) > 1:
        listing = ", ".join(f"{name}.input_scale={value!r}" for name, value in values.items())
        raise CheckpointError(
            f"{where}: projections sharing one input must share one calibrated input_scale; got {listing} "
            "(re-calibrate so the group's input scales are equal)"
        )
