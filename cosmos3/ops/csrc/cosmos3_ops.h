// Host entry points of the cosmos3 CUDA kernels.
//
// Torch-free on purpose: plain pointers, element counts and a stream in, a cudaError_t out, so every
// .cu file compiles with nvcc alone (scripts/compile_csrc.sh). torch_bindings.cpp checks the tensors and
// calls these; cosmos3/ops/cpu.py holds the CPU impls that reproduce the kernels' arithmetic bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cosmos3 {

enum class Dtype { kBFloat16, kFloat16, kFloat32, kFloat8E4M3 };

// One row of cosmos3/ops/launch_table.py: threads per block, and how many 16-byte vectors of each input a
// thread loads before it computes (more loads in flight per thread, fewer blocks).
struct LaunchConfig {
  int threads;
  int vectors_per_thread;
};

// silu_and_mul_2in's scalars in fp32, made by swiglu_scalars.
struct SwigluScalars {
  float exp2_coef;  // -alpha * log2(e): sigmoid(alpha * g) = 1 / (1 + 2^(g * exp2_coef))
  float gate_min;   // the gate range over which 2^(g * exp2_coef) is computed; outside, g is clamped to it
  float gate_max;
  float beta;
  float limit;  // read only when has_limit
  bool has_limit;
};

// Rounds alpha, beta and *limit (nullptr: no limit) to fp32 exactly as cosmos3/ops/cpu.py does.
SwigluScalars swiglu_scalars(double alpha, double beta, const double* limit);

// out = g' * sigmoid(alpha * g') * (u' + beta), with g' = min(g, limit), u' = clamp(u, -limit, limit) when
// has_limit. With scale != nullptr the result is multiplied by fp32(1 / *scale) and stored as saturated FP8
// e4m3; otherwise out_dtype must equal in_dtype.
cudaError_t silu_and_mul_2in(const void* gate,     // [n] in_dtype
                             const void* up,       // [n] in_dtype
                             void* out,            // [n] out_dtype
                             const float* scale,   // [1] or nullptr
                             int64_t n, Dtype in_dtype, Dtype out_dtype, SwigluScalars scalars,
                             LaunchConfig config, cudaStream_t stream);

// out = saturate_fp8(x / *scale), rounded to nearest even.
cudaError_t quantize_fp8(const void* x,        // [n] in_dtype
                         void* out,            // [n] FP8 e4m3
                         const float* scale,   // [1]
                         int64_t n, Dtype in_dtype, LaunchConfig config, cudaStream_t stream);

// out = weight * *scale in fp32, rounded once to out_dtype (nearest even); unlike CUDA eager torch's
// weight.to(bf16) * scale, the scale is not rounded to bf16 first.
cudaError_t dequantize_fp8(const void* weight,   // [n] FP8 e4m3
                           void* out,            // [n] out_dtype: bf16 or fp16
                           const float* scale,   // [1]
                           int64_t n, Dtype out_dtype, LaunchConfig config, cudaStream_t stream);

// RMSNorm of each row of x ([rows, dim]; csrc/rms_norm.cu states the arithmetic). With delta
// (nullptr: none) the row is x + delta rounded to dtype, written to sum_out. out is the normalized row in dtype,
// or with scale (nullptr: none) saturate_fp8(normalized / *scale) in FP8 e4m3.
cudaError_t rms_norm(const void* x,          // [rows, dim] dtype
                     const void* delta,      // [rows, dim] dtype or nullptr
                     const void* weight,     // [dim] dtype
                     void* sum_out,          // [rows, dim] dtype, written when delta is given
                     void* out,              // [rows, dim] dtype, or FP8 e4m3 with a scale
                     const float* scale,     // [1] or nullptr
                     int64_t rows, int64_t dim, float eps, Dtype dtype, cudaStream_t stream);

// One attention layer's inputs: the QK norm and RoPE of each head of q and k, with the tables of its token
// (out[s, h] = rope(rms_norm(x[s, h]) * weight)), k and v written after their prefixes (the layer's UND K/V;
// prefix = 0 for the UND tower): q_out = that of q, k_out = [k_prefix ; that of k], v_out = [v_prefix ; v].
// Row (s, h) of q starts at q + s * q_stride + h * dim, of k and v likewise (dim even).
cudaError_t attention_inputs(const void* q,         // [tokens, heads, dim] dtype, strides (q_stride, dim, 1)
                             int64_t q_stride,
                             const void* k,         // [tokens, kv_heads, dim] dtype, strides (k_stride, dim, 1)
                             int64_t k_stride,
                             const void* v,         // [tokens, kv_heads, dim] dtype, strides (v_stride, dim, 1)
                             int64_t v_stride,
                             const void* q_weight,  // [dim] dtype
                             const void* k_weight,  // [dim] dtype
                             const void* cos,       // [tokens, dim] dtype
                             const void* sin,       // [tokens, dim] dtype, the sign of rotate-half folded in
                             const void* k_prefix,  // [prefix, kv_heads, dim] dtype, contiguous
                             const void* v_prefix,  // [prefix, kv_heads, dim] dtype, contiguous
                             void* q_out,           // [tokens, heads, dim] dtype, contiguous
                             void* k_out,           // [prefix + tokens, kv_heads, dim] dtype, contiguous
                             void* v_out,           // [prefix + tokens, kv_heads, dim] dtype, contiguous
                             int64_t tokens, int64_t heads, int64_t kv_heads, int64_t prefix, int64_t dim,
                             float eps, Dtype dtype, cudaStream_t stream);

}  // namespace cosmos3
