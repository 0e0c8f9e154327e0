// RMSNorm over the last dim, fused with its neighbours in a decoder layer: rms_norm takes the residual add
// before it and the FP8 quantization after it (a layer's input norms feed FP8 projections); attention_inputs
// takes the rotary embedding after the QK norm of each head of q and k, and writes k and v behind the UND
// tower's K/V (GEN queries attend to [K_und ; K_gen]). At a still's 1,024 tokens each of those neighbours as a
// kernel of its own costs ~8 us, 36 layers x 10 of them a forward, and the QK norms and the two K/V
// concatenations alone are four launches a layer (on the H200: 8.0 + 8.0 + 2.1 + 2.1 us, mostly launch and
// tail latency for ~24 MB); fused, they are one (benchmarks/results/h200-kernels.md).
//
// Arithmetic, reproduced bit for bit by cosmos3/ops/cpu.py (the reduction order included):
//   x       = the row, or fp32(a) + fp32(d) rounded to the input dtype with a residual (written to sum_out)
//   sumsq   = sum of x^2 by fmaf in a fixed order: chunk c (elements 8c .. 8c + 7, the last one maybe short) of
//             a row belongs to lane c % lanes of the row's lanes (lanes = the power of two >= chunks, at most
//             256); each lane adds its chunks in order, then the lanes combine by halving (lane l + lane l + o
//             for o = lanes/2 .. 1, l < o: a warp's butterfly once o < 32)
//   inv     = 1 / sqrt(sumsq / dim + eps), each step correctly rounded (no rsqrtf: the CPU cannot match it)
//   n       = (x * inv) * w, rounded to the input dtype: F.rms_norm's value, one rounding
//   rms_norm: out = n, or saturate_fp8(n / scale) (quantize_fp8 of n) with a scale
//   attention_inputs: each row (a head of a token) of q and k,
//             out[j] = fmaf(n[(j + dim/2) % dim], signed_sin[j], n[j] * cos[j]) rounded to the input dtype:
//             rotate-half RoPE with its sign in the table (rope.py), dim even; the prefixes and v are copied,
//             bit for bit
// Rows whose length and addresses allow it move in 16-byte vectors; any other row element by element, with
// the same arithmetic in the same order.
#include <cstdint>

#include "cosmos3_ops.h"
#include "vec_fp8.cuh"

namespace cosmos3 {
namespace {

constexpr int kChunk = 8;  // elements a lane handles at once: one 16-byte load of a 16-bit row
// A row of up to 256 lanes (Nano's hidden size: 512 chunks, two a lane), as many rows to a block as fit. One
// warp a row left a still's 1,024 rows of 4,096 at ~8 warps an SM, too few loads in flight: the add + norm
// took 17.8 us for 28 MB. Short rows (a head: 16 lanes) still pack several to a warp.
constexpr int kThreads = 256;
constexpr int kMaxLanes = kThreads;

__host__ __device__ inline int64_t chunks_of(int64_t dim) { return (dim + kChunk - 1) / kChunk; }

int row_lanes(int64_t dim) {
  const int64_t chunks = chunks_of(dim);
  int lanes = 1;
  while (lanes < chunks && lanes < kMaxLanes) lanes *= 2;
  return lanes;
}

// How many of chunk c's 8 elements the row holds.
__device__ __forceinline__ int chunk_count(int64_t c, int64_t dim) {
  const int64_t left = dim - c * kChunk;
  return left < kChunk ? int(left) : kChunk;
}

// x rounded to T and back: the value a T tensor would hold.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// The first `count` elements of a chunk as fp32 (the rest 0, which adds nothing to a sum of squares): 16-byte
// loads when kVector (dim % 8 == 0 and every row 16-byte aligned, so count is 8), element loads otherwise.
template <typename T, bool kVector>
__device__ __forceinline__ void load_chunk(const T* p, float (&x)[kChunk], int count = kChunk) {
  if constexpr (kVector) {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int h = 0; h < kChunk / kPer; ++h) {
      const Vec<T, kPer> v = load_vec<T, kPer>(p + h * kPer);
#pragma unroll
      for (int i = 0; i < kPer; ++i) x[h * kPer + i] = to_float(v.v[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) x[i] = i < count ? to_float(p[i]) : 0.f;
  }
}

// Stores the first `count` of 8 fp32 results as Out: in accesses of 16 bytes of input (the row's alignment)
// when kVector, element by element otherwise.
template <typename Out, typename In, bool kVector>
__device__ __forceinline__ void store_chunk(Out* p, const float (&y)[kChunk], int count = kChunk) {
  if constexpr (kVector) {
    constexpr int kPer = 16 / sizeof(In);
#pragma unroll
    for (int h = 0; h < kChunk / kPer; ++h) {
      float piece[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) piece[i] = y[h * kPer + i];
      store_vec<Out, kPer>(p + h * kPer, piece);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const float one[1] = {y[i]};
      if (i < count) store_vec<Out, 1>(p + i, one);
    }
  }
}

// The row's value as the norm reads it: x, or x + delta rounded to T.
template <typename T, bool kResidual, bool kVector>
__device__ __forceinline__ void load_row_chunk(const T* x, const T* delta, int64_t at, float (&v)[kChunk],
                                               int count) {
  load_chunk<T, kVector>(x + at, v, count);
  if constexpr (kResidual) {
    float d[kChunk];
    load_chunk<T, kVector>(delta + at, d, count);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = round_to<T>(__fadd_rn(v[i], d[i]));
  }
}

// The lanes' sums halved to one: lane l + lane l + o for o = lanes/2 .. 1. Across warps (o >= 32) through shared
// memory; within a warp as a butterfly (lane l + lane l ^ o), whose lane 0 adds what the halving adds, and
// whose every lane ends with the same bits (fp32 addition commutes). Every thread of the block takes part
// (rows past the end with zeros): the block synchronizes when a row spans warps.
__device__ __forceinline__ float row_sum(float acc, int lanes) {
  if (lanes > 32) {
    __shared__ float part[kThreads];
    const int t = threadIdx.x, lane = t % lanes;
    part[t] = acc;
    __syncthreads();
    for (int o = lanes / 2; o >= 32; o /= 2) {
      if (lane < o) part[t] = __fadd_rn(part[t], part[t + o]);
      __syncthreads();
    }
    acc = part[t - lane + lane % 32];  // every warp of the row takes the row's first 32 partial sums
    lanes = 32;
  }
  for (int o = lanes / 2; o > 0; o /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
  return acc;
}

__device__ __forceinline__ float inverse_rms(float sumsq, int64_t dim, float eps) {
  return __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq, float(dim)), eps)));
}

// n = (x * inv) * w rounded to T, for a chunk whose weights are loaded.
template <typename T>
__device__ __forceinline__ void normalize_loaded(const float (&x)[kChunk], const float (&w)[kChunk], float inv,
                                                 float (&n)[kChunk]) {
#pragma unroll
  for (int i = 0; i < kChunk; ++i) n[i] = round_to<T>(__fmul_rn(__fmul_rn(x[i], inv), w[i]));
}

template <typename T, bool kVector>
__device__ __forceinline__ void normalize_chunk(const float (&x)[kChunk], const T* weight, float inv,
                                                float (&n)[kChunk], int count) {
  float w[kChunk];
  load_chunk<T, kVector>(weight, w, count);
  normalize_loaded<T>(x, w, inv, n);
}

// Lane `lane` of the row at thread `thread` of the rows' `block`-th block: rows are packed 32 / lanes to a warp.
struct RowLane {
  int64_t row;
  int lane;
};
__device__ __forceinline__ RowLane row_lane(int64_t block, int lanes) {
  const int64_t thread = block * kThreads + threadIdx.x;
  return {thread / lanes, int(thread % lanes)};
}

// The normalized chunk as the op's output: n, or n / scale in FP8.
template <typename Out>
__device__ __forceinline__ void to_output(float (&n)[kChunk], Divisor s) {
  if constexpr (std::is_same_v<Out, __nv_fp8_e4m3>) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) n[i] = divide(n[i], s);
  }
}

// A row of at most kHeld chunks a lane (Nano's 4,096: two), 16-byte aligned: the lane's chunks of x (+ delta)
// and of the weight are loaded once, together, and stay in registers for the normalization. One memory round
// trip instead of rms_norm_kernel's three (inputs; inputs again and the weight), which at a still's 1,024 rows
// (one wave of blocks) is most of the kernel's time. The same arithmetic in the same order.
template <typename T, typename Out, bool kResidual, int kHeld>
__global__ void __launch_bounds__(kThreads)
    rms_norm_held_kernel(const T* __restrict__ x, const T* __restrict__ delta, const T* __restrict__ weight,
                         T* __restrict__ sum_out, Out* __restrict__ out, const float* __restrict__ scale,
                         int64_t rows, int64_t dim, int lanes, float eps) {
  const auto [row, lane] = row_lane(blockIdx.x, lanes);
  const bool valid = row < rows;
  const int64_t chunks = dim / kChunk;
  float v[kHeld][kChunk], w[kHeld][kChunk];
  float acc = 0.f;
  if (valid) {
#pragma unroll
    for (int h = 0; h < kHeld; ++h) {
      const int64_t c = lane + h * lanes;
      if (c < chunks) {
        load_row_chunk<T, kResidual, true>(x, delta, row * dim + c * kChunk, v[h], kChunk);
        load_chunk<T, true>(weight + c * kChunk, w[h]);
      }
    }
#pragma unroll
    for (int h = 0; h < kHeld; ++h) {
      const int64_t c = lane + h * lanes;
      if (c < chunks) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) acc = __fmaf_rn(v[h][i], v[h][i], acc);
        if constexpr (kResidual) store_chunk<T, T, true>(sum_out + row * dim + c * kChunk, v[h]);
      }
    }
  }
  const float inv = inverse_rms(row_sum(acc, lanes), dim, eps);
  if (!valid) return;
  const Divisor s = scale == nullptr ? Divisor{1.f, 1.f} : make_divisor(*scale);
#pragma unroll
  for (int h = 0; h < kHeld; ++h) {
    const int64_t c = lane + h * lanes;
    if (c < chunks) {
      float n[kChunk];
      normalize_loaded<T>(v[h], w[h], inv, n);
      to_output<Out>(n, s);
      store_chunk<Out, T, true>(out + row * dim + c * kChunk, n);
    }
  }
}

template <typename T, typename Out, bool kResidual, bool kVector>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ delta, const T* __restrict__ weight,
                    T* __restrict__ sum_out, Out* __restrict__ out, const float* __restrict__ scale, int64_t rows,
                    int64_t dim, int lanes, float eps) {
  const auto [row, lane] = row_lane(blockIdx.x, lanes);
  const bool valid = row < rows;
  const int64_t chunks = chunks_of(dim);
  float acc = 0.f;
  if (valid) {
    // Unrolled so several chunks' loads are in flight together (rows too long for rms_norm_held_kernel, or not
    // 16-byte aligned); the fmaf chain keeps its order.
#pragma unroll 4
    for (int64_t c = lane; c < chunks; c += lanes) {
      const int64_t at = row * dim + c * kChunk;
      const int count = chunk_count(c, dim);
      float v[kChunk];
      load_row_chunk<T, kResidual, kVector>(x, delta, at, v, count);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) acc = __fmaf_rn(v[i], v[i], acc);
      if constexpr (kResidual) store_chunk<T, T, kVector>(sum_out + at, v, count);
    }
  }
  const float inv = inverse_rms(row_sum(acc, lanes), dim, eps);
  if (!valid) return;
  const Divisor s = scale == nullptr ? Divisor{1.f, 1.f} : make_divisor(*scale);
  // The second pass reads the inputs again (the row was just read: L1 or L2), never sum_out: __ldg may not
  // read what this kernel wrote.
#pragma unroll 4
  for (int64_t c = lane; c < chunks; c += lanes) {
    const int64_t at = row * dim + c * kChunk;
    const int count = chunk_count(c, dim);
    float v[kChunk], n[kChunk];
    load_row_chunk<T, kResidual, kVector>(x, delta, at, v, count);
    normalize_chunk<T, kVector>(v, weight + c * kChunk, inv, n, count);
    to_output<Out>(n, s);
    store_chunk<Out, T, kVector>(out + at, n, count);
  }
}

// The normalized values, at the elements dim / 2 away, that rotate-half pairs with chunk c's: one chunk
// when dim % 16 == 0 (kVector), else element by element.
template <typename T, bool kVector>
__device__ __forceinline__ void partner_chunk(const T* xr, const T* weight, int64_t c, int64_t dim, float inv,
                                              float (&np)[kChunk], int count) {
  if constexpr (kVector) {
    const int64_t partner = (c + chunks_of(dim) / 2) % chunks_of(dim);
    float p[kChunk];
    load_chunk<T, kVector>(xr + partner * kChunk, p);
    normalize_chunk<T, kVector>(p, weight + partner * kChunk, inv, np, kChunk);
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int64_t j = (c * kChunk + i + dim / 2) % dim;
      np[i] = i < count ? round_to<T>(__fmul_rn(__fmul_rn(to_float(xr[j]), inv), to_float(weight[j]))) : 0.f;
    }
  }
}

// Rows (token s, head h) of dim elements, read at x + s * stride + h * dim (a projection's heads, whose token
// stride exceeds heads * dim when they are a column slice of a fused QKV; a contiguous prefix has stride
// heads * dim) and written contiguously to out.
template <typename T>
struct HeadRows {
  const T* x;
  int64_t stride;
  int64_t heads;
  int64_t rows;  // tokens * heads
  T* out;
};

template <typename T>
__device__ __forceinline__ const T* row_start(const HeadRows<T>& r, int64_t row, int64_t dim) {
  return r.x + (row / r.heads) * r.stride + (row % r.heads) * dim;
}

// norm_rope_rows where a row is one chunk a lane within a warp (chunks == lanes <= 32: a Nano head of
// 128 is 16 lanes): lane c's rotate-half partner is lane c ^ lanes/2 of the same row, so the partner's
// normalized values come by shuffle instead of a reload and a second normalization, and the row's four loads
// (x, weight, cos, sin) are all issued before the reduction: one memory round trip a row instead of three.
template <typename T>
__device__ __forceinline__ void norm_rope_lane_rows(const HeadRows<T>& x, const T* __restrict__ weight,
                                                    const T* __restrict__ cos, const T* __restrict__ sin,
                                                    int64_t dim, int lanes, float eps, int64_t block) {
  const auto [row, lane] = row_lane(block, lanes);
  const bool valid = row < x.rows;
  const int64_t at = lane * kChunk, token = row / x.heads;
  float v[kChunk] = {}, w[kChunk] = {}, co[kChunk] = {}, si[kChunk] = {};
  if (valid) {
    load_chunk<T, true>(row_start(x, row, dim) + at, v);
    load_chunk<T, true>(weight + at, w);
    load_chunk<T, true>(cos + token * dim + at, co);
    load_chunk<T, true>(sin + token * dim + at, si);
  }
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) acc = __fmaf_rn(v[i], v[i], acc);
  const float inv = inverse_rms(row_sum(acc, lanes), dim, eps);
  float y[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const float n = round_to<T>(__fmul_rn(__fmul_rn(v[i], inv), w[i]));  // normalize_chunk's value
    const float np = __shfl_xor_sync(0xffffffffu, n, lanes / 2);         // every lane: rows past the end too
    y[i] = __fmaf_rn(np, si[i], __fmul_rn(n, co[i]));
  }
  if (valid) store_chunk<T, T, true>(x.out + row * dim + at, y);
}

// The QK norm and RoPE of x's rows, with the tables' row of each row's token; `block` counts from the rows'
// first block. Every thread of the block calls it (row_sum may synchronize the block).
template <typename T, bool kVector>
__device__ __forceinline__ void norm_rope_rows(const HeadRows<T>& x, const T* __restrict__ weight,
                                               const T* __restrict__ cos, const T* __restrict__ sin, int64_t dim,
                                               int lanes, float eps, int64_t block) {
  if constexpr (kVector) {
    if (lanes == chunks_of(dim) && lanes <= 32) {
      return norm_rope_lane_rows(x, weight, cos, sin, dim, lanes, eps, block);
    }
  }
  const auto [row, lane] = row_lane(block, lanes);
  const bool valid = row < x.rows;
  const int64_t chunks = chunks_of(dim);
  const int64_t token = row / x.heads;
  const T* xr = row_start(x, row, dim);
  float acc = 0.f;
  if (valid) {
    for (int64_t c = lane; c < chunks; c += lanes) {
      float v[kChunk];
      load_chunk<T, kVector>(xr + c * kChunk, v, chunk_count(c, dim));
#pragma unroll
      for (int i = 0; i < kChunk; ++i) acc = __fmaf_rn(v[i], v[i], acc);
    }
  }
  const float inv = inverse_rms(row_sum(acc, lanes), dim, eps);
  if (!valid) return;
  for (int64_t c = lane; c < chunks; c += lanes) {
    const int count = chunk_count(c, dim);
    float v[kChunk], n[kChunk], np[kChunk], co[kChunk], si[kChunk], y[kChunk];
    load_chunk<T, kVector>(xr + c * kChunk, v, count);
    normalize_chunk<T, kVector>(v, weight + c * kChunk, inv, n, count);
    partner_chunk<T, kVector>(xr, weight, c, dim, inv, np, count);
    load_chunk<T, kVector>(cos + token * dim + c * kChunk, co, count);
    load_chunk<T, kVector>(sin + token * dim + c * kChunk, si, count);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) y[i] = __fmaf_rn(np[i], si[i], __fmul_rn(n[i], co[i]));
    store_chunk<T, T, kVector>(x.out + row * dim + c * kChunk, y, count);
  }
}

// Moves word `unit` of r's rows (16 bytes, or one element; a row is whole words), the bits as they are, and
// says so; or takes r's words off `unit` for the next rows.
template <typename T, typename Word>
__device__ __forceinline__ bool copy_word(const HeadRows<T>& r, int64_t dim, int64_t& unit) {
  constexpr int64_t kPer = sizeof(Word) / sizeof(T);
  const int64_t words = dim / kPer;  // a row's
  if (unit >= r.rows * words) {
    unit -= r.rows * words;
    return false;
  }
  const int64_t row = unit / words, at = (unit % words) * kPer;
  const Word word = __ldg(reinterpret_cast<const Word*>(row_start(r, row, dim) + at));
  *reinterpret_cast<Word*>(r.out + row * dim + at) = word;
  return true;
}

// Word `unit` of K's prefix, V's prefix and V's rows laid end to end.
template <typename T, typename Word>
__device__ __forceinline__ void copy_words(const HeadRows<T>& k_prefix, const HeadRows<T>& v_prefix,
                                           const HeadRows<T>& v, int64_t dim, int64_t unit) {
  if (copy_word<T, Word>(k_prefix, dim, unit)) return;
  if (copy_word<T, Word>(v_prefix, dim, unit)) return;
  copy_word<T, Word>(v, dim, unit);
}

// One layer's attention inputs in one launch: blocks [0, q_blocks) normalize and rotate q's rows, the next
// k_blocks k's, the rest copy a word a thread. Each part starts on a block boundary, so the branch is uniform
// in a block and no copy shares a block with a norm's row_sum.
template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    attention_inputs_kernel(HeadRows<T> q, HeadRows<T> k, HeadRows<T> k_prefix, HeadRows<T> v_prefix, HeadRows<T> v,
                            const T* __restrict__ q_weight, const T* __restrict__ k_weight,
                            const T* __restrict__ cos, const T* __restrict__ sin, int64_t dim, int lanes, float eps,
                            int64_t q_blocks, int64_t k_blocks, bool copy_vector) {
  const int64_t block = blockIdx.x;
  if (block < q_blocks) {
    norm_rope_rows<T, kVector>(q, q_weight, cos, sin, dim, lanes, eps, block);
  } else if (block < q_blocks + k_blocks) {
    norm_rope_rows<T, kVector>(k, k_weight, cos, sin, dim, lanes, eps, block - q_blocks);
  } else {
    const int64_t unit = (block - q_blocks - k_blocks) * kThreads + threadIdx.x;
    if (copy_vector) {
      copy_words<T, uint4>(k_prefix, v_prefix, v, dim, unit);
    } else {
      copy_words<T, typename LoadWord<sizeof(T)>::type>(k_prefix, v_prefix, v, dim, unit);
    }
  }
}

int64_t blocks_for(int64_t rows, int lanes) { return (rows * lanes + kThreads - 1) / kThreads; }

template <typename T, typename Out, bool kResidual>
cudaError_t launch_rms_norm(const T* x, const T* delta, const T* weight, T* sum_out, Out* out, const float* scale,
                            int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  const int lanes = row_lanes(dim);
  const int64_t blocks = blocks_for(rows, lanes);
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  // With dim % 8 == 0, 16-byte aligned bases keep every chunk aligned.
  const bool vector = dim % kChunk == 0 && aligned_to(x, 16) && (!kResidual || (aligned_to(delta, 16) && aligned_to(sum_out, 16))) &&
                      aligned_to(weight, 16) && aligned_to(out, 16);
  using Kernel = void (*)(const T*, const T*, const T*, T*, Out*, const float*, int64_t, int64_t, int, float);
  const int64_t held = (chunks_of(dim) + lanes - 1) / lanes;  // chunks a lane
  const Kernel kernel = !vector     ? rms_norm_kernel<T, Out, kResidual, false>
                        : held <= 1 ? rms_norm_held_kernel<T, Out, kResidual, 1>
                        : held == 2 ? rms_norm_held_kernel<T, Out, kResidual, 2>
                        : held <= 4 ? rms_norm_held_kernel<T, Out, kResidual, 4>
                                    : rms_norm_kernel<T, Out, kResidual, true>;
  kernel<<<int(blocks), kThreads, 0, stream>>>(x, delta, weight, sum_out, out, scale, rows, dim, lanes, eps);
  return cudaGetLastError();
}

template <typename T, typename Out>
cudaError_t dispatch_residual(const T* x, const T* delta, const T* weight, T* sum_out, Out* out,
                              const float* scale, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  return delta == nullptr ? launch_rms_norm<T, Out, false>(x, delta, weight, sum_out, out, scale, rows, dim, eps,
                                                           stream)
                          : launch_rms_norm<T, Out, true>(x, delta, weight, sum_out, out, scale, rows, dim, eps,
                                                          stream);
}

}  // namespace

cudaError_t rms_norm(const void* x, const void* delta, const void* weight, void* sum_out, void* out,
                     const float* scale, int64_t rows, int64_t dim, float eps, Dtype dtype, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_input_dtype(dtype, [&](auto type) -> cudaError_t {
    using T = decltype(type);
    const auto* xt = static_cast<const T*>(x);
    const auto* dt = static_cast<const T*>(delta);
    const auto* wt = static_cast<const T*>(weight);
    auto* st = static_cast<T*>(sum_out);
    if (scale != nullptr) {
      return dispatch_residual(xt, dt, wt, st, static_cast<__nv_fp8_e4m3*>(out), scale, rows, dim, eps, stream);
    }
    return dispatch_residual(xt, dt, wt, st, static_cast<T*>(out), scale, rows, dim, eps, stream);
  });
}

cudaError_t attention_inputs(const void* q, int64_t q_stride, const void* k, int64_t k_stride, const void* v,
                             int64_t v_stride, const void* q_weight, const void* k_weight, const void* cos,
                             const void* sin, const void* k_prefix, const void* v_prefix, void* q_out, void* k_out,
                             void* v_out, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t prefix,
                             int64_t dim, float eps, Dtype dtype, cudaStream_t stream) {
  return dispatch_input_dtype(dtype, [&](auto type) -> cudaError_t {
    using T = decltype(type);
    auto* ko = static_cast<T*>(k_out);
    auto* vo = static_cast<T*>(v_out);
    const int64_t prefix_size = prefix * kv_heads * dim;  // k_out's and v_out's elements before the new rows
    const HeadRows<T> qr{static_cast<const T*>(q), q_stride, heads, tokens * heads, static_cast<T*>(q_out)};
    const HeadRows<T> kr{static_cast<const T*>(k), k_stride, kv_heads, tokens * kv_heads, ko + prefix_size};
    const HeadRows<T> kp{static_cast<const T*>(k_prefix), kv_heads * dim, kv_heads, prefix * kv_heads, ko};
    const HeadRows<T> vp{static_cast<const T*>(v_prefix), kv_heads * dim, kv_heads, prefix * kv_heads, vo};
    const HeadRows<T> vr{static_cast<const T*>(v), v_stride, kv_heads, tokens * kv_heads, vo + prefix_size};
    // A row starts at its base plus multiples of dim and of the token stride: in rows of whole 16-byte words,
    // aligned bases and an aligned stride keep every word aligned. Rows that are not there need no alignment.
    const bool whole_words = (dim * int64_t(sizeof(T))) % 16 == 0;
    const auto aligned_rows = [](const HeadRows<T>& r) {
      return r.rows == 0 ||
             (aligned_to(r.x, 16) && (r.stride * int64_t(sizeof(T))) % 16 == 0 && aligned_to(r.out, 16));
    };
    // The norms' vector path reads whole partner chunks: dim % 16 == 0 (whole words too).
    const bool vector = dim % (2 * kChunk) == 0 && aligned_rows(qr) && aligned_rows(kr) &&
                        aligned_to(q_weight, 16) && aligned_to(k_weight, 16) && aligned_to(cos, 16) &&
                        aligned_to(sin, 16);
    const bool copy_vector = whole_words && aligned_rows(kp) && aligned_rows(vp) && aligned_rows(vr);
    const int64_t row_words = copy_vector ? dim * int64_t(sizeof(T)) / 16 : dim;

    const int lanes = row_lanes(dim);
    const int64_t q_blocks = blocks_for(qr.rows, lanes), k_blocks = blocks_for(kr.rows, lanes);
    const int64_t copy_blocks = ((kp.rows + vp.rows + vr.rows) * row_words + kThreads - 1) / kThreads;
    const int64_t blocks = q_blocks + k_blocks + copy_blocks;
    if (blocks == 0) return cudaSuccess;
    if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
    const auto* qw = static_cast<const T*>(q_weight);
    const auto* kw = static_cast<const T*>(k_weight);
    const auto* ct = static_cast<const T*>(cos);
    const auto* st = static_cast<const T*>(sin);
    if (vector) {
      attention_inputs_kernel<T, true><<<int(blocks), kThreads, 0, stream>>>(
          qr, kr, kp, vp, vr, qw, kw, ct, st, dim, lanes, eps, q_blocks, k_blocks, copy_vector);
    } else {
      attention_inputs_kernel<T, false><<<int(blocks), kThreads, 0, stream>>>(
          qr, kr, kp, vp, vr, qw, kw, ct, st, dim, lanes, eps, q_blocks, k_blocks, copy_vector);
    }
    return cudaGetLastError();
  });
}

}  // namespace cosmos3
