// CUDA impls of the cosmos3 ops: tensors checked here, then handed to the torch-free launchers.
//
// Note on registration: the schemas of torch.ops.cosmos3.* are defined in Python (cosmos3/ops/__init__.py, with
// torch.library), together with their CPU and fake impls, so the ops exist on a machine without CUDA or
// nvcc. This file only adds the CUDA kernels, through TORCH_LIBRARY_IMPL(cosmos3, CUDA, m), when
// cosmos3/ops/loader.py loads it (prebuilt in the wheel, or JIT-built). A TORCH_LIBRARY(cosmos3, m) block
// here would own the namespace instead, and the ops would only exist after a CUDA build. The argument checks
// below apply the rules of _check_swiglu_args / _check_quantize_args / _check_dequantize_args /
// _check_norm_args / _check_attention_inputs_args in cosmos3/ops/__init__.py, in the same order and words.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <array>
#include <string>
#include <tuple>
#include <utility>

#include "cosmos3_ops.h"

namespace cosmos3 {
namespace {

enum OpIndex { kSiluAndMul2in, kQuantizeFp8, kDequantizeFp8, kNumOps };
constexpr int kMaxSm = 256;

// Launch parameters by SM version (10 * major + minor); SM 0 holds the fallback for any unset version.
// Written by set_launch_params while cosmos3/ops/loader.py loads this module (and by the launch sweep), read on
// every call.
std::array<std::array<LaunchConfig, kNumOps>, kMaxSm> launch_configs{};

// Numbers in messages go through std::to_string, never an ostream: on the H200 image, formatting an integer
// with this extension's ostream code crashed the process (segfault inside std::ostream::_M_insert<long> in
// this .so, apparently its own copy of libstdc++'s stream code, whose locale facets do not match the
// process's). Strings are unaffected.
std::string list_str(c10::IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(values[i]);
  return out + "]";
}

OpIndex op_index(const std::string& op) {
  if (op == "silu_and_mul_2in") return kSiluAndMul2in;
  if (op == "quantize_fp8") return kQuantizeFp8;
  if (op == "dequantize_fp8") return kDequantizeFp8;
  TORCH_CHECK_VALUE(false, "set_launch_params: unknown op '", op,
                    "'; expected silu_and_mul_2in, quantize_fp8 or dequantize_fp8");
}

void set_launch_params(int64_t sm, const std::string& op, int64_t threads, int64_t vectors_per_thread) {
  TORCH_CHECK_VALUE(sm >= 0 && sm < kMaxSm, "set_launch_params: sm must be in [0, ", std::to_string(kMaxSm),
                    "), got ", std::to_string(sm));
  launch_configs[sm][op_index(op)] = LaunchConfig{int(threads), int(vectors_per_thread)};
}

LaunchConfig launch_config(OpIndex op) {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const int sm = prop->major * 10 + prop->minor;
  const LaunchConfig own = sm < kMaxSm ? launch_configs[sm][op] : LaunchConfig{};
  const LaunchConfig config = own.threads > 0 ? own : launch_configs[0][op];
  TORCH_CHECK(config.threads > 0, "cosmos3: no launch parameters for sm_", std::to_string(sm),
              "; load the CUDA ops through cosmos3.ops.load_cuda_ops()");
  return config;
}

Dtype input_dtype(const char* op, const char* name, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return Dtype::kBFloat16;
    case at::kHalf: return Dtype::kFloat16;
    case at::kFloat: return Dtype::kFloat32;
    default: TORCH_CHECK_VALUE(false, op, ": ", name, " must be bfloat16, float16 or float32, got ",
                               c10::toString(t.scalar_type()));
  }
}

void check_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", list_str(t.strides()),
                    " for shape ", list_str(t.sizes()), "; call .contiguous() first");
}

void check_scale(const char* op, const at::Tensor& scale, const at::Tensor& input) {
  TORCH_CHECK_VALUE(scale.scalar_type() == at::kFloat, op, ": scale must be float32, got ",
                    c10::toString(scale.scalar_type()), "; pass scale.float()");
  TORCH_CHECK_VALUE(scale.numel() == 1, op, ": scale must have exactly one element, got shape ",
                    list_str(scale.sizes()), "; pass one per-tensor scale, shape [1] or []");
  TORCH_CHECK_VALUE(scale.device() == input.device(), op, ": scale must be on the input's device ",
                    input.device().str(), ", got ", scale.device().str(), "; move it there with .to()");
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
}

// gate, up: [...] equal shapes; scale: [1] or [] fp32 -> [...] in gate's dtype, or FP8 e4m3 with a scale.
at::Tensor silu_and_mul_2in_cuda(const at::Tensor& gate, const at::Tensor& up, const std::optional<at::Tensor>& scale,
                            std::optional<double> limit, double alpha, double beta) {
  constexpr const char* kOp = "silu_and_mul_2in";
  TORCH_CHECK_VALUE(gate.sizes() == up.sizes(), kOp, ": gate and up must have the same shape, got ",
                    list_str(gate.sizes()), " and ", list_str(up.sizes()));
  TORCH_CHECK_VALUE(gate.scalar_type() == up.scalar_type(), kOp, ": gate and up must have the same dtype, got ",
                    c10::toString(gate.scalar_type()), " and ", c10::toString(up.scalar_type()));
  TORCH_CHECK_VALUE(gate.device() == up.device(), kOp, ": gate and up must be on the same device, got ",
                    gate.device().str(), " and ", up.device().str());
  const Dtype in_dtype = input_dtype(kOp, "gate", gate);
  check_contiguous(kOp, "gate", gate);
  check_contiguous(kOp, "up", up);
  if (scale) check_scale(kOp, *scale, gate);
  TORCH_CHECK_VALUE(!limit || *limit > 0, kOp, ": limit must be positive, got ", std::to_string(*limit));

  const c10::cuda::OptionalCUDAGuard guard(gate.device());
  at::Tensor out = at::empty(gate.sizes(), gate.options().dtype(scale ? at::kFloat8_e4m3fn : gate.scalar_type()));
  const SwigluScalars scalars = swiglu_scalars(alpha, beta, limit ? &*limit : nullptr);
  check_launch(kOp, cosmos3::silu_and_mul_2in(gate.data_ptr(), up.data_ptr(), out.data_ptr(),
                                              scale ? scale->data_ptr<float>() : nullptr, gate.numel(), in_dtype,
                                              scale ? Dtype::kFloat8E4M3 : in_dtype, scalars,
                                              launch_config(kSiluAndMul2in), at::cuda::getCurrentCUDAStream()));
  return out;
}

// x: [...]; scale: [1] or [] fp32 -> [...] FP8 e4m3.
at::Tensor quantize_fp8_cuda(const at::Tensor& x, const at::Tensor& scale) {
  constexpr const char* kOp = "quantize_fp8";
  const Dtype in_dtype = input_dtype(kOp, "x", x);
  check_contiguous(kOp, "x", x);
  check_scale(kOp, scale, x);

  const c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  check_launch(kOp, cosmos3::quantize_fp8(x.data_ptr(), out.data_ptr(), scale.data_ptr<float>(), x.numel(), in_dtype,
                                          launch_config(kQuantizeFp8), at::cuda::getCurrentCUDAStream()));
  return out;
}

// weight: [...] FP8 e4m3; scale: [1] or [] fp32 -> [...] in dtype (bf16 or fp16).
at::Tensor dequantize_fp8_cuda(const at::Tensor& weight, const at::Tensor& scale, at::ScalarType dtype) {
  constexpr const char* kOp = "dequantize_fp8";
  TORCH_CHECK_VALUE(weight.scalar_type() == at::kFloat8_e4m3fn, kOp, ": weight must be float8_e4m3fn, got ",
                    c10::toString(weight.scalar_type()), "; pass the checkpoint's FP8 weight (a 16-bit one needs no "
                    "dequantization)");
  check_contiguous(kOp, "weight", weight);
  check_scale(kOp, scale, weight);
  TORCH_CHECK_VALUE(dtype == at::kBFloat16 || dtype == at::kHalf, kOp, ": dtype must be bfloat16 or float16, got ",
                    c10::toString(dtype), "; pass the 16-bit dtype of the activations the weight multiplies");

  const c10::cuda::OptionalCUDAGuard guard(weight.device());
  at::Tensor out = at::empty(weight.sizes(), weight.options().dtype(dtype));
  check_launch(kOp, cosmos3::dequantize_fp8(weight.data_ptr(), out.data_ptr(), scale.data_ptr<float>(), weight.numel(),
                                            dtype == at::kBFloat16 ? Dtype::kBFloat16 : Dtype::kFloat16,
                                            launch_config(kDequantizeFp8), at::cuda::getCurrentCUDAStream()));
  return out;
}

// A norm's weight (named `name`) of the input `x_name`, whose last dim is dim.
void check_norm_weight(const char* op, const char* name, const at::Tensor& weight, const char* x_name,
                       const at::Tensor& x, int64_t dim) {
  TORCH_CHECK_VALUE(weight.scalar_type() == x.scalar_type(), op, ": ", name, " must have ", x_name, "'s dtype ",
                    c10::toString(x.scalar_type()), ", got ", c10::toString(weight.scalar_type()));
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == dim, op, ": ", name, " must have shape [",
                    std::to_string(dim), "] (", x_name, "'s last dim), got ", list_str(weight.sizes()));
  check_contiguous(op, name, weight);
  TORCH_CHECK_VALUE(weight.device() == x.device(), op, ": ", name, " must be on ", x_name, "'s device ",
                    x.device().str(), ", got ", weight.device().str());
}

// x (and delta): [..., dim] contiguous, dim > 0; the rules of _check_norm_args in cosmos3/ops/__init__.py.
Dtype check_norm_args(const char* op, const at::Tensor& x, const at::Tensor* delta, const at::Tensor& weight,
                      const std::optional<at::Tensor>& scale) {
  const Dtype dtype = input_dtype(op, "x", x);
  TORCH_CHECK_VALUE(delta == nullptr || (delta->sizes() == x.sizes() && delta->scalar_type() == x.scalar_type() &&
                                         delta->device() == x.device()),
                    op, ": delta must match x (shape ", list_str(x.sizes()), ", ", c10::toString(x.scalar_type()), ", ",
                    x.device().str(), "), got shape ", list_str(delta->sizes()), ", ",
                    c10::toString(delta->scalar_type()), ", ", delta->device().str());
  check_contiguous(op, "x", x);
  if (delta != nullptr) check_contiguous(op, "delta", *delta);
  const int64_t dim = x.dim() > 0 ? x.size(-1) : 0;
  TORCH_CHECK_VALUE(dim != 0, op, ": x needs a non-empty last dim to normalize, got shape ", list_str(x.sizes()));
  check_norm_weight(op, "weight", weight, "x", x, dim);
  if (scale) check_scale(op, *scale, x);
  return dtype;
}

// The shared body of rms_norm and add_rms_norm; sum_out is defined (and written) with a delta.
at::Tensor launch_norm(const char* op, const at::Tensor& x, const at::Tensor* delta, const at::Tensor& weight,
                       double eps, const std::optional<at::Tensor>& scale, const at::Tensor& sum_out, Dtype dtype) {
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(scale ? at::kFloat8_e4m3fn : x.scalar_type()));
  const int64_t dim = x.size(-1);
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  check_launch(op, cosmos3::rms_norm(x.data_ptr(), delta ? delta->data_ptr() : nullptr, weight.data_ptr(),
                                     delta ? sum_out.data_ptr() : nullptr, out.data_ptr(),
                                     scale ? scale->data_ptr<float>() : nullptr, rows, dim, float(eps), dtype,
                                     at::cuda::getCurrentCUDAStream()));
  return out;
}

// x: [..., dim]; weight: [dim] -> [..., dim] in x's dtype, or FP8 e4m3 with a scale.
at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps,
                         const std::optional<at::Tensor>& scale) {
  const Dtype dtype = check_norm_args("rms_norm", x, nullptr, weight, scale);
  return launch_norm("rms_norm", x, nullptr, weight, eps, scale, at::Tensor(), dtype);
}

// x, delta: [..., dim]; weight: [dim] -> (x + delta, its norm), the norm in x's dtype or FP8 with a scale.
std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& delta,
                                                     const at::Tensor& weight, double eps,
                                                     const std::optional<at::Tensor>& scale) {
  const Dtype dtype = check_norm_args("add_rms_norm", x, &delta, weight, scale);
  at::Tensor sum = at::empty_like(x);
  at::Tensor out = launch_norm("add_rms_norm", x, &delta, weight, eps, scale, sum, dtype);
  return {sum, out};
}

// The rules of _check_attention_inputs_args in cosmos3/ops/__init__.py.
Dtype check_attention_inputs_args(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos,
                                  const at::Tensor& sin, const at::Tensor& k_prefix, const at::Tensor& v_prefix) {
  const Dtype dtype = input_dtype(op, "q", q);
  TORCH_CHECK_VALUE(q.dim() == 3, op, ": q must be [tokens, heads, head_dim], got shape ", list_str(q.sizes()));
  const int64_t tokens = q.size(0), dim = q.size(2);
  TORCH_CHECK_VALUE(dim != 0 && dim % 2 == 0, op, ": head_dim must be positive and even (RoPE rotates pairs), got ",
                    std::to_string(dim));
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"k", k}, {"v", v}}) {
    TORCH_CHECK_VALUE(t.scalar_type() == q.scalar_type() && t.dim() == 3 && t.size(0) == tokens && t.size(2) == dim &&
                          t.device() == q.device(),
                      op, ": ", name, " must be [", std::to_string(tokens), ", kv_heads, ", std::to_string(dim), "] ",
                      c10::toString(q.scalar_type()), " on ", q.device().str(), " (q's tokens, head_dim, dtype and "
                      "device), got ", list_str(t.sizes()), " ", c10::toString(t.scalar_type()), " on ",
                      t.device().str());
  }
  const int64_t kv_heads = k.size(1);
  TORCH_CHECK_VALUE(v.size(1) == kv_heads, op, ": v must have k's ", std::to_string(kv_heads), " heads, got ",
                    std::to_string(v.size(1)));
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"q", q}, {"k", k}, {"v", v}}) {
    TORCH_CHECK_VALUE(t.stride(2) == 1 && t.stride(1) == dim, op, ": each token's heads of ", name,
                      " must be contiguous (strides [*, ", std::to_string(dim), ", 1]), got strides ",
                      list_str(t.strides()), "; call .contiguous() first");
  }
  check_norm_weight(op, "q_weight", q_weight, "q", q, dim);
  check_norm_weight(op, "k_weight", k_weight, "k", k, dim);
  for (const auto& [name, table] : {std::pair<const char*, const at::Tensor&>{"cos", cos}, {"sin", sin}}) {
    TORCH_CHECK_VALUE(table.scalar_type() == q.scalar_type() && table.dim() == 2 && table.size(0) == tokens &&
                          table.size(1) == dim && table.device() == q.device(),
                      op, ": ", name, " must be [", std::to_string(tokens), ", ", std::to_string(dim), "] ",
                      c10::toString(q.scalar_type()), " on ", q.device().str(), ", got ", list_str(table.sizes()), " ",
                      c10::toString(table.scalar_type()), " on ", table.device().str());
    check_contiguous(op, name, table);
  }
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor&>{"k_prefix", k_prefix}, {"v_prefix", v_prefix}}) {
    TORCH_CHECK_VALUE(t.scalar_type() == q.scalar_type() && t.dim() == 3 && t.size(1) == kv_heads && t.size(2) == dim &&
                          t.device() == q.device(),
                      op, ": ", name, " must be [prefix, ", std::to_string(kv_heads), ", ", std::to_string(dim), "] ",
                      c10::toString(q.scalar_type()), " on ", q.device().str(), ", got ", list_str(t.sizes()), " ",
                      c10::toString(t.scalar_type()), " on ", t.device().str());
    check_contiguous(op, name, t);
  }
  TORCH_CHECK_VALUE(v_prefix.size(0) == k_prefix.size(0), op, ": v_prefix must have k_prefix's ",
                    std::to_string(k_prefix.size(0)), " tokens, got ", std::to_string(v_prefix.size(0)));
  return dtype;
}

// q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim] (each token's heads contiguous); q_weight, k_weight:
// [dim]; cos, sin: [tokens, dim]; k_prefix, v_prefix: [prefix, kv_heads, dim] -> q [tokens, heads, dim],
// k, v [prefix + tokens, kv_heads, dim], contiguous.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_inputs_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_weight,
    const at::Tensor& k_weight, double eps, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_prefix,
    const at::Tensor& v_prefix) {
  constexpr const char* kOp = "attention_inputs";
  const Dtype dtype = check_attention_inputs_args(kOp, q, k, v, q_weight, k_weight, cos, sin, k_prefix, v_prefix);
  const int64_t tokens = q.size(0), heads = q.size(1), kv_heads = k.size(1), dim = q.size(2);
  const int64_t prefix = k_prefix.size(0);

  const c10::cuda::OptionalCUDAGuard guard(q.device());
  at::Tensor q_out = at::empty(q.sizes(), q.options());  // contiguous, whatever q's token stride
  at::Tensor k_out = at::empty({prefix + tokens, kv_heads, dim}, k.options());
  at::Tensor v_out = at::empty({prefix + tokens, kv_heads, dim}, v.options());
  check_launch(kOp, cosmos3::attention_inputs(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(),
                                              v.stride(0), q_weight.data_ptr(), k_weight.data_ptr(), cos.data_ptr(),
                                              sin.data_ptr(), k_prefix.data_ptr(), v_prefix.data_ptr(),
                                              q_out.data_ptr(), k_out.data_ptr(), v_out.data_ptr(), tokens, heads,
                                              kv_heads, prefix, dim, float(eps), dtype,
                                              at::cuda::getCurrentCUDAStream()));
  return {q_out, k_out, v_out};
}

}  // namespace
}  // namespace cosmos3

TORCH_LIBRARY_IMPL(cosmos3, CUDA, m) {
  m.impl("silu_and_mul_2in", &cosmos3::silu_and_mul_2in_cuda);
  m.impl("quantize_fp8", &cosmos3::quantize_fp8_cuda);
  m.impl("dequantize_fp8", &cosmos3::dequantize_fp8_cuda);
  m.impl("rms_norm", &cosmos3::rms_norm_cuda);
  m.impl("add_rms_norm", &cosmos3::add_rms_norm_cuda);
  m.impl("attention_inputs", &cosmos3::attention_inputs_cuda);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_launch_params", &cosmos3::set_launch_params, "Sets one op's launch parameters for one SM version",
        pybind11::arg("sm"), pybind11::arg("op"), pybind11::arg("threads"), pybind11::arg("vectors_per_thread"));
}
