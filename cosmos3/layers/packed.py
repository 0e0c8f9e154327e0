"""A tower's static-FP8 Q/K/V, which read one input, run as one GEMM at few tokens.

Their FP8 weights live in one ``[sum(N), K]`` buffer whose row slices are the layers' own ``weight`` parameters:
the same shapes and bytes (``state_dict`` is unchanged), nothing held twice, and the split path still runs on
them. K and V are narrow (1,024 columns for Nano: 64 tiles for 132 SMs at a still's 1,024 tokens), so one
6,144-column GEMM fills the GPU better than three; at a clip's 44,160 tokens cuBLAS's per-column-scale kernel
is slower than its per-tensor one. ``PackedProjections.wants`` decides by the tokens, against
``PACKED_MAX_TOKENS`` for the device's SM (benchmarks/bench_packed_gemm.py measures a row). An MLP's gate and up
stay two GEMMs: packed (24,576 columns, the swiglu reading the two halves in place), they ran slower on the H200
at every size from 1,024 tokens up (benchmarks/results/h200-not-kept.md).

Each projection keeps its own calibrated scales: the wide GEMM scales its columns by ``input_scale *
weight_scale`` of their projection (the fp32 product the per-tensor GEMM uses) and its rows by 1, so every
column is the split GEMM's, bit for bit (tests/cosmos3/test_packed.py, on the CPU and the H200).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cosmos3.layers.linear import Linear, shared_input_scale
from cosmos3.ops import FP8
from cosmos3.quant.fp8_static import StaticFP8LinearMethod, scaled_mm

# The most GEMM rows (tokens) a packed Q/K/V runs at, by SM version (10 * major + minor); an SM without a row
# never packs (the split path is the one every arch was verified on). sm_90: the last token count at which
# benchmarks/bench_packed_gemm.py measured the packed GEMM ahead of the split ones for Nano's GEN Q/K/V on the H200
# (benchmarks/results/h200-fp8.md: each count's speed-up).
PACKED_MAX_TOKENS: dict[int, int] = {90: 4096}


def max_tokens(device: torch.device) -> int:
    """Rows up to which a packed Q/K/V beats its split GEMMs on ``device`` (0: never; the CPU gains nothing)."""
    if device.type != "cuda":
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return PACKED_MAX_TOKENS.get(10 * major + minor, 0)


class PackedProjections:
    """Linears (static FP8, bias-free, one ``in_features``) whose weights are row slices of one buffer.

    Not a module: the linears stay where the checkpoint names them; this only holds the buffer, the
    column scales and a row of ones, all derived from them.
    """

    def __init__(self, linears: Sequence[Linear]):
        self.linears = tuple(linears)
        self.sizes = tuple(linear.out_features for linear in self.linears)
        first = self.linears[0]
        self.weight = torch.empty(sum(self.sizes), first.in_features, dtype=FP8, device=first.weight.device)
        for linear, rows in zip(self.linears, self.weight.split(self.sizes), strict=True):
            linear.weight = nn.Parameter(rows, requires_grad=False)  # loading copies into it (fp8_static)
        self._scales_of: tuple | None = None  # which scale tensors (and versions) the column scales were made from
        self._column_scales: torch.Tensor | None = None  # [1, sum(N)] fp32
        self._ones: torch.Tensor | None = None  # [max_tokens, 1] fp32: the rows' scales

    @staticmethod
    def of(linears: Sequence[Linear]) -> PackedProjections | None:
        """A packed group of ``linears``, or None where they cannot share one GEMM (not all static FP8, a bias)."""
        packable = all(isinstance(linear.quant_method, StaticFP8LinearMethod) and not linear.has_bias
                       for linear in linears)
        return PackedProjections(linears) if packable else None

    def _scales_key(self) -> tuple:
        return tuple((id(t), t._version) for linear in self.linears for t in (linear.input_scale, linear.weight_scale))

    def refresh(self) -> None:
        """Column scales from the members' scales, and the rows' ones: after loading, outside graph capture."""
        columns = [(linear.input_scale.float() * linear.weight_scale.float()).reshape(1).expand(size)
                   for linear, size in zip(self.linears, self.sizes, strict=True)]
        self._column_scales = torch.cat(columns).reshape(1, -1)
        rows = max_tokens(self.weight.device)
        if self._ones is None or self._ones.shape[0] != rows:
            self._ones = torch.ones(rows, 1, device=self.weight.device)
        self._scales_of = self._scales_key()

    def wants(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (the group's shared input) runs packed: FP8 (every member at W8A8), few enough tokens,
        the members still on the buffer (no ``.to()`` since) and scales made from their current ones."""
        tokens = x.numel() // x.shape[-1]
        if x.dtype != FP8 or tokens > (0 if self._ones is None else self._ones.shape[0]):
            return False
        on_buffer = all(linear.weight.data_ptr() == rows.data_ptr()
                        for linear, rows in zip(self.linears, self.weight.split(self.sizes), strict=True))
        if not on_buffer or shared_input_scale(self.linears) is None:  # the sharing rule's one place
            return False
        if self._scales_of != self._scales_key():
            if torch.cuda.is_current_stream_capturing():
                return False  # never make tensors inside a graph: this capture runs split
            self.refresh()
        return True

    def __call__(self, x_fp8: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``[..., K]`` FP8 -> each member's output ``[tokens, N_i]``, column slices of one ``[tokens, sum(N)]``."""
        x2d = x_fp8.reshape(-1, x_fp8.shape[-1])
        ones = self._ones[: x2d.shape[0]]
        first = self.linears[0]
        y = scaled_mm(x2d, self.weight, ones, self._column_scales, first.out_dtype,
                      accumulation=first.quant_method.accumulation)  # wants(): every member is at W8A8 here
        return y.split(self.sizes, dim=-1)
