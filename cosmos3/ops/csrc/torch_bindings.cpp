// CUDA impls of the cosmos3 ops: tensors handed to the torch-free launchers.
//
// Registration: every op's schema, its argument rules (cosmos3/ops/checks.py), its CPU and fake impls and its
// CUDA entry are Python (cosmos3/ops/__init__.py, with torch.library), so the ops exist on a machine without CUDA
// or nvcc and each rule is written once. The CUDA entry checks the arguments, then calls the same op of the private
// namespace _cosmos3_cuda, whose CUDA kernels this file registers (TORCH_LIBRARY_IMPL(_cosmos3_cuda, CUDA, m)) when
// cosmos3/ops/loader.py loads it (prebuilt in the wheel, or JIT-built). These functions therefore receive checked
// tensors; they only launch. Calls that reach _cosmos3_cuda directly skip the checks: it is private.

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

// Numbers in messages go through std::to_string, never an ostream: this .so may carry its own copy of libstdc++'s
// stream code, whose locale facets need not match the process's, and an integer formatted through it can crash
// the process (a segfault in std::ostream::_M_insert<long>). Strings are unaffected.
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

// The dtype tag of an input the Python rules accepted (bfloat16, float16 or float32).
Dtype input_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return Dtype::kBFloat16;
    case at::kHalf: return Dtype::kFloat16;
    default: return Dtype::kFloat32;
  }
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
}

// gate, up: [...] equal shapes; scale: [1] or [] fp32 -> [...] in gate's dtype, or FP8 e4m3 with a scale.
at::Tensor silu_and_mul_2in_cuda(const at::Tensor& gate, const at::Tensor& up, const std::optional<at::Tensor>& scale,
                            std::optional<double> limit, double alpha, double beta) {
  constexpr const char* kOp = "silu_and_mul_2in";
  const Dtype in_dtype = input_dtype(gate);

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
  const Dtype in_dtype = input_dtype(x);

  const c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  check_launch(kOp, cosmos3::quantize_fp8(x.data_ptr(), out.data_ptr(), scale.data_ptr<float>(), x.numel(), in_dtype,
                                          launch_config(kQuantizeFp8), at::cuda::getCurrentCUDAStream()));
  return out;
}

// weight: [...] FP8 e4m3; scale: [1] or [] fp32 -> [...] in dtype (bf16 or fp16).
at::Tensor dequantize_fp8_cuda(const at::Tensor& weight, const at::Tensor& scale, at::ScalarType dtype) {
  constexpr const char* kOp = "dequantize_fp8";

  const c10::cuda::OptionalCUDAGuard guard(weight.device());
  at::Tensor out = at::empty(weight.sizes(), weight.options().dtype(dtype));
  check_launch(kOp, cosmos3::dequantize_fp8(weight.data_ptr(), out.data_ptr(), scale.data_ptr<float>(), weight.numel(),
                                            dtype == at::kBFloat16 ? Dtype::kBFloat16 : Dtype::kFloat16,
                                            launch_config(kDequantizeFp8), at::cuda::getCurrentCUDAStream()));
  return out;
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
  return launch_norm("rms_norm", x, nullptr, weight, eps, scale, at::Tensor(), input_dtype(x));
}

// x, delta: [..., dim]; weight: [dim] -> (x + delta, its norm), the norm in x's dtype or FP8 with a scale.
std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& delta,
                                                     const at::Tensor& weight, double eps,
                                                     const std::optional<at::Tensor>& scale) {
  at::Tensor sum = at::empty_like(x);
  at::Tensor out = launch_norm("add_rms_norm", x, &delta, weight, eps, scale, sum, input_dtype(x));
  return {sum, out};
}

// q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim] (each token's heads contiguous); q_weight, k_weight:
// [dim]; cos, sin: [tokens, dim]; k_prefix, v_prefix: [prefix, kv_heads, dim] -> q [tokens, heads, dim],
// k, v [prefix + tokens, kv_heads, dim], contiguous.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_inputs_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_weight,
    const at::Tensor& k_weight, double eps, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_prefix,
    const at::Tensor& v_prefix) {
  constexpr const char* kOp = "attention_inputs";
  const Dtype dtype = input_dtype(q);
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

TORCH_LIBRARY_IMPL(_cosmos3_cuda, CUDA, m) {
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
