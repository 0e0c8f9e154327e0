"""Whether a worker's imports load compiled bytecode, or compile from source at every start.

A worker imports torch, diffusers and transformers before it is ready, and with them what they import (sympy,
scipy, scikit-learn where installed: 2,700 modules compiled in 8.6 s of a transformers import on the H200 host).
pip leaves their ``.pyc`` files beside the sources. An environment without them (a read-only copy with no
``__pycache__``, installed with ``--no-compile``, or ``PYTHONDONTWRITEBYTECODE=1`` so Python never keeps what it
compiled) compiles all of it again in every worker process. On the H200 host a Nano FP8 pipeline loaded in 30.7 s
that way, and in 10.7 s with the bytecode cached (benchmarks/results/h200-render.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys

FIX = ("byte-compile the environment once (python -m compileall -q <site-packages>), or let Python keep what it "
       "compiles (unset PYTHONDONTWRITEBYTECODE; PYTHONPYCACHEPREFIX=<a writable folder> where site-packages is "
       "read-only)")


def uncached() -> list[str]:
    """The top-level packages of this process's imported modules that have no bytecode file where Python looks
    for it (beside the source, or under ``sys.pycache_prefix``): each start compiles them from source."""
    missing = set()
    for name, module in list(sys.modules.items()):
        source = getattr(module, "__file__", None)
        # (torch.ops and torch.classes name a relative file that does not exist)
        if isinstance(source, str) and source.endswith(".py") and os.path.isabs(source) and name != "__main__":
            if not os.path.exists(importlib.util.cache_from_source(source)):
                missing.add(name.partition(".")[0])
    return sorted(missing)
