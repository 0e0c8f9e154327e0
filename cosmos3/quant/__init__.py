"""How a Linear computes. ``get_quant_method`` is the one place a precision picks a method."""

from __future__ import annotations

from cosmos3.quant.base import LinearMethod
from cosmos3.quant.fp8_dynamic import DynamicFP8LinearMethod
from cosmos3.quant.fp8_static import StaticFP8LinearMethod
from cosmos3.quant.unquantized import UnquantizedLinearMethod
from cosmos3.quant.w8a16 import W8A16LinearMethod

PRECISIONS = ("bf16", "fp8-dynamic", "fp8-static")

UNQUANTIZED = UnquantizedLinearMethod()
DYNAMIC_FP8 = DynamicFP8LinearMethod()
STATIC_FP8 = StaticFP8LinearMethod()
W8A16 = W8A16LinearMethod()


def get_quant_method(precision: str) -> LinearMethod:
    """The method for decoder projections under ``precision`` (modules on the ignore list use UNQUANTIZED)."""
    if precision == "bf16":
        return UNQUANTIZED
    if precision == "fp8-dynamic":
        return DYNAMIC_FP8
    if precision == "fp8-static":
        return STATIC_FP8
    raise ValueError(f"unsupported precision {precision!r}; expected one of {PRECISIONS}")


__all__ = ["LinearMethod", "get_quant_method", "PRECISIONS", "UNQUANTIZED", "DYNAMIC_FP8", "STATIC_FP8", "W8A16"]
