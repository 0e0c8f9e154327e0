"""JSON read from a file someone else may have written (a checkpoint's configs and headers, the farm's records).

Python's decoder recurses once per level of nesting, so `[[[[...` 100,000 deep (a few hundred kilobytes, inside
every size bound) raises RecursionError, which no caller expects from text that is merely not JSON. Every such read
goes through `loads`, which refuses it as ValueError, as it refuses any other text that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any


def loads(data: str | bytes, **options: Any) -> Any:
    """`json.loads(data, **options)`. Raises ValueError (also for a value nested too deep to decode)."""
    try:
        return json.loads(data, **options)
    except RecursionError:
        raise ValueError("nested too deeply to be decoded") from None
