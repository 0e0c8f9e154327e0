"""The interface every quant method implements (TensorRT-LLM's ``LinearMethodBase`` shape).

A ``Linear`` owns its tensors; a method object decides how they are created, loaded and used.
Methods hold no tensors, so one instance serves every layer and switching a layer between two
methods (step precision) is an attribute assignment. ``layer`` is that ``cosmos3.layers.linear.Linear``, typed as
the ``nn.Module`` it is: the layer imports this interface, not the other way round.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

# A fused Linear loads one dict per shard: {"weight": T, "weight_scale": T, ...}.
ShardTensors = dict[str, dict[str, torch.Tensor]]


class LinearMethod(ABC):
    #: Accepts an FP8 activation quantized once for a group (static W8A8 only).
    shares_input_quant: bool = False

    @abstractmethod
    def create_weights(self, layer: nn.Module, dtype: torch.dtype) -> None:
        """Register the layer's parameters (shapes from ``layer``), uninitialised."""

    @abstractmethod
    def checkpoint_tensors(self, layer: nn.Module) -> tuple[str, ...]:
        """Tensor suffixes each shard must have in the checkpoint (``weight``, ``input_scale``, ...)."""

    @abstractmethod
    def load_weights(self, layer: nn.Module, shards: ShardTensors, name: str) -> None:
        """Copy checkpoint tensors in; ``name`` is the layer's checkpoint prefix for error messages."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027 - optional hook, no-op default
        """One-time work after every tensor is final (never in ``apply``)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``y = x W^T (+ b)`` the way this method computes it; ``x`` is ``[..., in_features]``."""

    def quantize_input(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not quantize activations ahead of apply()")

    def fp8_output_scale(self, layer: nn.Module) -> torch.Tensor | None:
        """The scale a producer should emit FP8 with for this layer's input, or None for 16-bit."""
        return None


def require_dtype(tensor: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    from cosmos3.errors import CheckpointError

    if tensor.dtype != dtype:
        raise CheckpointError(f"{what} is {tensor.dtype}, expected {dtype}")


def require_scalar_scale(tensor: torch.Tensor, what: str) -> None:
    from cosmos3.errors import CheckpointError

    if tensor.dtype != torch.float32 or tensor.numel() != 1:
        raise CheckpointError(
            f"{what} must be a float32 scalar (per-tensor scale), got {tensor.dtype} with shape {tuple(tensor.shape)}"
        )
