"""SwiGLU MLP: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, fused or split by quantization.

Split (static FP8): gate and up read one FP8 quantization of ``x`` (made by the norm before, at
``input_scale``); silu·up is emitted in FP8 straight for ``down_proj`` (``cosmos3.ops.silu_and_mul_2in``
with ``down_proj.input_scale``).
On a 16-bit step every one of those sharing sites stands down.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosmos3 import ops
from cosmos3.layers.attention import LinearFactory
from cosmos3.layers.linear import quantize_shared_input, shared_input_scale, validate_shared_input_scales


class GatedMLP(nn.Module):
    def __init__(self, *, hidden_size: int, intermediate_size: int, split_gate_up: bool, make_linear: LinearFactory):
        super().__init__()
        self.split_gate_up = split_gate_up
        if split_gate_up:
            self.gate_proj = make_linear("gate_proj", hidden_size, intermediate_size)
            self.up_proj = make_linear("up_proj", hidden_size, intermediate_size)
        else:
            self.gate_up_proj = make_linear("gate_up_proj", hidden_size, (intermediate_size, intermediate_size),
                                            shard_keys=("gate_proj", "up_proj"))
        self.down_proj = make_linear("down_proj", intermediate_size, hidden_size)

    def input_scale(self) -> torch.Tensor | None:
        """The FP8 scale the norm before this MLP should quantize with (None: 16-bit input)."""
        return shared_input_scale([self.gate_proj, self.up_proj]) if self.split_gate_up else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` (FP8 when ``input_scale`` says so) -> ``[..., H]``."""
        if not self.split_gate_up:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        x_in = quantize_shared_input(x, [self.gate_proj, self.up_proj])
        gate, up = self.gate_proj(x_in), self.up_proj(x_in)
        scale = self.down_proj.method.fp8_output_scale(self.down_proj)  # None on 16-bit steps
        return self.down_proj(ops.silu_and_mul_2in(gate, up, scale=scale))

    def finish_loading(self, where: str) -> None:
        """Checks the loaded scales (gate/up stay two GEMMs: packed, they ran slower, see cosmos3/layers/packed.py)."""
        if self.split_gate_up:
            validate_shared_input_scales({"gate_proj": self.gate_proj, "up_proj": self.up_proj}, where)
