"""The precision a denoising step runs: one object per model, which the step-precision controller sets once per
step (``cosmos3.precision``), the CUDA graphs read (a graph per mode) and the layers obey: a GEN Linear computes with
its 16-bit method and the attention runs BF16 on a W8A16 step (``a16``)."""

from __future__ import annotations

import torch


class StepPrecision:
    """``a16``: this step runs W8A16. ``held``: each GEN Linear's weight dequantized once for W8A16 passes, while a
    ``cosmos3.quant.w8a16.DequantizedWeights`` is held (``cosmos3.cuda_graphs`` decides when), else None."""

    def __init__(self):
        self.a16 = False
        self.held: dict[torch.nn.Module, torch.Tensor] | None = None

    def held_weight(self, linear: torch.nn.Module) -> torch.Tensor | None:
        return None if self.held is None else self.held.get(linear)
