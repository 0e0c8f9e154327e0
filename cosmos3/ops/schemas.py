"""The op schemas: the names and signatures of ``torch.ops.cosmos3`` (the ops callers use: checked, then run by the
CPU twin or the CUDA kernel) and of ``torch.ops._cosmos3_cuda`` (the same ops, private: the CUDA kernels that
csrc/torch_bindings.cpp registers once ``cosmos3.ops.loader`` loads the library). A leaf module, so the loader can
define them before the library loads without importing the op wrappers that call the loader."""

from __future__ import annotations

import torch

SCHEMAS = (
    "silu_and_mul_2in(Tensor gate, Tensor up, Tensor? scale=None, float? limit=None, float alpha=1.0, "
    "float beta=0.0) -> Tensor",
    "quantize_fp8(Tensor x, Tensor scale) -> Tensor",
    "dequantize_fp8(Tensor weight, Tensor scale, ScalarType dtype) -> Tensor",
    "rms_norm(Tensor x, Tensor weight, float eps, Tensor? scale=None) -> Tensor",
    "add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps, Tensor? scale=None) -> (Tensor, Tensor)",
    "attention_inputs(Tensor q, Tensor k, Tensor v, Tensor q_weight, Tensor k_weight, float eps, Tensor cos, "
    "Tensor sin, Tensor k_prefix, Tensor v_prefix) -> (Tensor, Tensor, Tensor)",
)
NAMES = tuple(schema.partition("(")[0] for schema in SCHEMAS)

LIB = torch.library.Library("cosmos3", "FRAGMENT")
CUDA_LIB = torch.library.Library("_cosmos3_cuda", "FRAGMENT")
for _schema in SCHEMAS:
    LIB.define(_schema, tags=(torch.Tag.pt2_compliant_tag,))
    CUDA_LIB.define(_schema, tags=(torch.Tag.pt2_compliant_tag,))
