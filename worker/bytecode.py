"""Whether a worker's big imports load compiled bytecode, or compile from source at every start.

A worker imports torch, diffusers, transformers and FlashInfer before it is ready. pip leaves their ``.pyc`` files
beside the sources. An environment without them (a read-only copy with no ``__pycache__``, installed with
``--no-compile``, or ``PYTHONDONTWRITEBYTECODE=1`` so Python never keeps what it compiled) compiles all of it
again in every worker process. On the H200 host a Nano FP8 pipeline loaded in 30.7 s that way, and in 10.7 s with
the bytecode cached (benchmarks/results/h200-2026-12-01-worker-start.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys

PACKAGES = ("torch", "diffusers", "transformers", "flashinfer")
FIX = ("byte-compile the environment once (python -m compileall -q <site-packages>), or let Python keep what it "
       "compiles (unset PYTHONDONTWRITEBYTECODE; PYTHONPYCACHEPREFIX=<a writable folder> where site-packages is "
       "read-only)")


def uncached(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The imported ones of ``packages`` whose ``__init__`` has no bytecode file where Python looks for it
    (beside the source, or under ``sys.pycache_prefix``)."""
    missing = []
    for name in packages:
        source = getattr(sys.modules.get(name), "__file__", None)
        if source is not None and source.endswith(".py"):
            if not os.path.exists(importlib.util.cache_from_source(source)):
                missing.append(name)
    return missing
