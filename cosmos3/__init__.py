"""Cosmos3 model code: the transformer, its FP8 paths and the render pipeline.

``cosmos3.rules.config`` stays importable without torch (the farm driver uses it); everything that
needs torch is imported on first use.
"""

from cosmos3.rules.config import Cosmos3Config, uses_static_fp8

__all__ = ["Cosmos3Config", "uses_static_fp8", "load_transformer"]


def __getattr__(name: str):
    if name == "load_transformer":
        from cosmos3.checkpoint.loader import load_transformer

        return load_transformer
    raise AttributeError(f"module 'cosmos3' has no attribute {name!r}")
