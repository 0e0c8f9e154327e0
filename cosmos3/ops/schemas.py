"""The ``cosmos3`` op schemas: the names and signatures both the Python impls (``cosmos3.ops``) and the CUDA
library (csrc/torch_bindings.cpp, loaded by ``cosmos3.ops.loader``) register kernels under. A leaf module, so
the loader can define them before the library loads without importing the op wrappers that call the loader."""

from __future__ import annotations

import torch

LIB = torch.library.Library("cosmos3", "FRAGMENT")
LIB.define("silu_and_mul_2in(Tensor gate, Tensor up, Tensor? scale=None, float? limit=None, float alpha=1.0, "
           "float beta=0.0) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))
LIB.define("quantize_fp8(Tensor x, Tensor scale) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))
LIB.define("dequantize_fp8(Tensor weight, Tensor scale, ScalarType dtype) -> Tensor",
           tags=(torch.Tag.pt2_compliant_tag,))
LIB.define("rms_norm(Tensor x, Tensor weight, float eps, Tensor? scale=None) -> Tensor",
           tags=(torch.Tag.pt2_compliant_tag,))
LIB.define("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps, Tensor? scale=None) -> (Tensor, Tensor)",
           tags=(torch.Tag.pt2_compliant_tag,))
LIB.define("attention_inputs(Tensor q, Tensor k, Tensor v, Tensor q_weight, Tensor k_weight, float eps, Tensor cos, "
           "Tensor sin, Tensor k_prefix, Tensor v_prefix) -> (Tensor, Tensor, Tensor)",
           tags=(torch.Tag.pt2_compliant_tag,))
