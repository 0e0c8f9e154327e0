"""How a Linear computes. ``get_quant_method`` is the one place a precision picks a method."""

from __future__ import annotations

from cosmos3.quant.base import LinearMethod
from cosmos3.quant.fp8_dynamic import DynamicFP8LinearMethod
from cosmos3.quant.fp8_static import StaticFP8LinearMethod
from cosmos3.quant.unquantized import UnquantizedLinearMethod
from cosmos3.quant.w8a16 import W8A16LinearMethod
from cosmos3.rules.load_options import FP8_ACCUMULATIONS, RUN_PRECISIONS

UNQUANTIZED = UnquantizedLinearMethod()
W8A16 = W8A16LinearMethod()
# One instance per (FP8 precision, accumulation): a layer's method is compared by identity (step precision).
_FP8 = {(precision, accumulation): method(accumulation)
        for precision, method in (("fp8-dynamic", DynamicFP8LinearMethod), ("fp8-static", StaticFP8LinearMethod))
        for accumulation in FP8_ACCUMULATIONS}
DYNAMIC_FP8 = _FP8["fp8-dynamic", "fast"]  # the default accumulation's
STATIC_FP8 = _FP8["fp8-static", "fast"]


def get_quant_method(precision: str, accumulation: str = "fast") -> LinearMethod:
    """The method for decoder projections under ``precision`` (modules on the ignore list use UNQUANTIZED);
    FP8 methods sum as ``accumulation`` says (``cosmos3.rules.load_options.FP8_ACCUMULATIONS``)."""
    if precision == "bf16":
        return UNQUANTIZED
    if precision not in RUN_PRECISIONS:
        raise ValueError(f"unsupported precision {precision!r}; expected one of {RUN_PRECISIONS}")
    if accumulation not in FP8_ACCUMULATIONS:
        raise ValueError(f"unsupported FP8 accumulation {accumulation!r}; expected one of {FP8_ACCUMULATIONS}")
    return _FP8[precision, accumulation]


__all__ = ["LinearMethod", "get_quant_method", "UNQUANTIZED", "DYNAMIC_FP8", "STATIC_FP8", "W8A16"]
