"""What a value read from JSON or YAML is: the type checks every rule shares.

``bool`` is an ``int`` in Python, but ``steps: yes`` in a manifest or ``"count": true`` in a config is a mistake, not
1; and YAML 1.1 reads a bare ``off`` as false, so ``cache: off`` arrives as False.
"""

from __future__ import annotations

import math
from typing import Any


def is_int(value: Any) -> bool:
    """An integer, never a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """An int or a float, never a bool (inf and nan included)."""
    return is_int(value) or isinstance(value, float)


def is_number(value: Any) -> bool:
    """A finite real number: nan and inf pass every comparison check, so they are refused here. An int of any size
    passes (``math.isfinite`` of one above 1e308 overflows, so ints are not converted)."""
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def yaml_off(value: Any) -> Any:
    """``off`` where YAML 1.1 read a bare ``off`` as false (``step_precision: off``, ``cache: off``); else ``value``."""
    return "off" if value is False else value
