// Shared by the elementwise kernels: 16-byte vector loads, conversions to and from fp32, saturating FP8
// stores, and one vectorized "map" kernel with its launcher. Torch-free (see cosmos3_ops.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cosmos3_ops.h"

namespace cosmos3 {

// N elements of T that move as one memory access of N * sizeof(T) bytes.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// The unsigned type __ldg reads in one access of `bytes` bytes.
template <int bytes>
struct LoadWord;
template <> struct LoadWord<1> { using type = unsigned char; };
template <> struct LoadWord<2> { using type = unsigned short; };
template <> struct LoadWord<4> { using type = unsigned int; };
template <> struct LoadWord<8> { using type = uint2; };
template <> struct LoadWord<16> { using type = uint4; };

// One read-only (non-coherent cache path) load of a whole vector: LDG.E.128 for 16 bytes.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  using Word = typename LoadWord<sizeof(Vec<T, N>)>::type;
  const Word word = __ldg(reinterpret_cast<const Word*>(p));
  Vec<T, N> out;
  memcpy(&out, &word, sizeof(out));
  return out;
}

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
// Exact: every e4m3 value is a half (cvt.rn.f16x2.e4m3x2 on sm_89+), and every half a float.
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.__x, __NV_E4M3)));
}

// Round-to-nearest-even into a 16/32-bit type, matching torch's Tensor.to() on the CPU.
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ float from_float(float x) { return x; }

// FP8 e4m3 with hardware round-to-nearest-even and saturation (cvt.rn.satfinite.e4m3x2.f32 on sm_89+).
// SATFINITE is the clamp to +-448: it equals clamp(x, -448, 448).to(float8_e4m3fn) bit for bit on finite
// values and +-inf (CUDA Math API, FP8 conversion), so no separate fminf/fmaxf clamp, which would also turn NaN into
// +-448 instead of NaN.
__device__ __forceinline__ __nv_fp8x2_storage_t to_fp8x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ __nv_fp8_storage_t to_fp8(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// A per-tensor scale as a divisor: the scale and its correctly rounded reciprocal, made once per thread.
struct Divisor {
  float scale;
  float inv;
};
__device__ __forceinline__ Divisor make_divisor(float scale) { return {scale, __frcp_rn(scale)}; }

// x / d.scale, correctly rounded like __fdiv_rn, with FMA-pipe operations and no per-element branch
// (Markstein): q = x * inv is within an ulp of the quotient, the fma residual x - q * scale is then exact,
// and q + residual * inv rounds correctly. The residual can underflow for |x| < 2^-100, leaving q within an
// ulp; FP8 cannot see that for any scale >= 2^-80 (such quotients are far below its 2^-9 smallest step).
__device__ __forceinline__ float divide(float x, Divisor d) {
  const float q = __fmul_rn(x, d.inv);
  const float residual = __fmaf_rn(-q, d.scale, x);
  // A zero residual: q is exact (and keeps a zero quotient's sign, which the fma would not). A non-finite
  // one: q overflowed, or the scale is 0 or inf, where q is the IEEE quotient already.
  const bool correct = fabsf(residual) > 0.f && fabsf(residual) < INFINITY;
  return correct ? __fmaf_rn(residual, d.inv, q) : q;
}

// Converts N fp32 results to Out and writes them as one access of N * sizeof(Out) bytes.
template <typename Out, int N>
__device__ __forceinline__ void store_vec(Out* dst, const float (&y)[N]) {
  if constexpr (std::is_same_v<Out, __nv_fp8_e4m3> && N % 2 == 0) {
    Vec<__nv_fp8x2_storage_t, N / 2> pairs;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) pairs.v[i] = to_fp8x2(y[2 * i], y[2 * i + 1]);
    *reinterpret_cast<Vec<__nv_fp8x2_storage_t, N / 2>*>(dst) = pairs;
  } else if constexpr (std::is_same_v<Out, __nv_fp8_e4m3>) {
    static_assert(N == 1, "an odd FP8 vector is a single element");
    *reinterpret_cast<__nv_fp8_storage_t*>(dst) = to_fp8(y[0]);
  } else {
    Vec<Out, N> out;
#pragma unroll
    for (int i = 0; i < N; ++i) out.v[i] = from_float<Out>(y[i]);
    *reinterpret_cast<Vec<Out, N>*>(dst) = out;
  }
}

// The inputs of one map: kInputs tensors of the same dtype and element count.
template <typename In, int kInputs>
struct Inputs {
  const In* ptr[kInputs];
};

// out[i] = op(inputs[...][i] as fp32, divisor of *scale) for i < n, with a divisor of 1 for a null scale. The
// scale is read on the device (CUDA-graph replays see in-place updates) once per thread.
// Thread t of block b owns the vectors b * blockDim * kVecsPerThread + t + k * blockDim (k < kVecsPerThread),
// so each warp touches contiguous 512-byte runs; all of a thread's loads are issued before its first use to
// keep them in flight together. The n % kVec elements past the last whole vector go to the first threads of
// block 0.
template <int kVec, int kVecsPerThread, typename In, int kInputs, typename Out, typename Op>
__global__ void __launch_bounds__(1024 / kVecsPerThread)
    map_kernel(Inputs<In, kInputs> in, Out* __restrict__ out, const float* __restrict__ scale, int64_t n, Op op) {
  // Not make_divisor(1.f) without a scale: that unconditional reciprocal took the FP8 swiglu kernel from 60
  // to 80 registers (ptxas -v) and 97% to 90% of copy.
  const Divisor s = scale == nullptr ? Divisor{1.f, 1.f} : make_divisor(*scale);
  const int64_t n_vec = n / kVec;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x * kVecsPerThread + threadIdx.x;

  Vec<In, kVec> x[kVecsPerThread][kInputs];
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k) {
    const int64_t v = first + int64_t(k) * blockDim.x;
    if (v < n_vec) {
#pragma unroll
      for (int j = 0; j < kInputs; ++j) x[k][j] = load_vec<In, kVec>(in.ptr[j] + v * kVec);
    }
  }
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k) {
    const int64_t v = first + int64_t(k) * blockDim.x;
    if (v < n_vec) {
      float y[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        float a[kInputs];
#pragma unroll
        for (int j = 0; j < kInputs; ++j) a[j] = to_float(x[k][j].v[i]);
        y[i] = op(a, s);
      }
      store_vec<Out, kVec>(out + v * kVec, y);
    }
  }

  if constexpr (kVec > 1) {
    const int64_t i = n_vec * kVec + threadIdx.x;
    if (blockIdx.x == 0 && i < n) {
      float a[kInputs];
#pragma unroll
      for (int j = 0; j < kInputs; ++j) a[j] = to_float(in.ptr[j][i]);
      const float y[1] = {op(a, s)};
      store_vec<Out, 1>(out + i, y);
    }
  }
}

template <int kVec, int kVecsPerThread, typename In, int kInputs, typename Out, typename Op>
cudaError_t launch_map_kernel(Inputs<In, kInputs> in, Out* out, const float* scale, int64_t n, Op op,
                              int threads, cudaStream_t stream) {
  const int64_t per_block = int64_t(threads) * kVecsPerThread;
  const int64_t blocks = (n / kVec + per_block - 1) / per_block;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  // A grid of at least one block: fewer than kVec elements are all tail.
  map_kernel<kVec, kVecsPerThread><<<blocks > 0 ? int(blocks) : 1, threads, 0, stream>>>(in, out, scale, n, op);
  return cudaGetLastError();
}

__host__ inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Runs op over n elements with 16-byte input vectors, or element by element when a pointer is not aligned
// to its vector (a contiguous view with a storage offset).
template <typename In, int kInputs, typename Out, typename Op>
cudaError_t launch_map(Inputs<In, kInputs> in, Out* out, const float* scale, int64_t n, Op op,
                       LaunchConfig config, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(In);
  bool aligned = aligned_to(out, kVec * sizeof(Out));
  for (int j = 0; j < kInputs; ++j) aligned = aligned && aligned_to(in.ptr[j], 16);
  if (!aligned) return launch_map_kernel<1, 1>(in, out, scale, n, op, config.threads, stream);
  switch (config.vectors_per_thread) {
    case 1: return launch_map_kernel<kVec, 1>(in, out, scale, n, op, config.threads, stream);
    case 2: return launch_map_kernel<kVec, 2>(in, out, scale, n, op, config.threads, stream);
    case 4: return launch_map_kernel<kVec, 4>(in, out, scale, n, op, config.threads, stream);
    default: return cudaErrorInvalidValue;
  }
}

// Calls f(T{}) with the CUDA type of a 16-bit float dtype.
template <typename F>
cudaError_t dispatch_16bit_dtype(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kBFloat16: return f(__nv_bfloat16{});
    case Dtype::kFloat16: return f(__half{});
    default: return cudaErrorInvalidValue;
  }
}

// Calls f(T{}) with the CUDA type of a 16/32-bit input dtype.
template <typename F>
cudaError_t dispatch_input_dtype(Dtype dtype, F&& f) {
  return dtype == Dtype::kFloat32 ? f(float{}) : dispatch_16bit_dtype(dtype, f);
}

}  // namespace cosmos3
