// silu_and_mul_2in: SwiGLU from separate gate and up tensors (static-FP8 Cosmos3 keeps gate_proj and up_proj
// split), out = g' * sigmoid(alpha * g') * (u' + beta), optionally multiplied by 1 / scale (a per-tensor scale)
// and stored as FP8 e4m3 straight for down_proj.
//
// Bit-exact CPU reference: every fp32 operation below is a single correctly rounded IEEE operation (the _rn
// intrinsics also keep nvcc from contracting or reordering them), and the exponential and the reciprocal are
// our own (a polynomial 2^x and Newton steps), not expf and a division: expf's last bit differs from the
// CPU's exp for some inputs, and an IEEE division costs a MUFU.RCP, five FMAs and a per-element slow-path
// branch, which left the FP8 path instruction-bound at 86-89% of copy bandwidth on the H200 (97-104% with
// Newton steps). cosmos3/ops/cpu.py evaluates the same sequence with torch ops (each fmaf exactly, through fp64)
// and gets the same bits for every input.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cosmos3_ops.h"
#include "vec_fp8.cuh"

namespace cosmos3 {
namespace {

// log2(e) rounded to fp32; exp(-alpha * g) = 2^(g * exp2_coef) with exp2_coef = fp32(-alpha) * kLog2e.
constexpr float kLog2e = 0x1.715476p+0f;
// 2^f ~= 1 + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * c5)))) on f in [-1/2, 1/2]: a least-squares fit of
// the relative error, rounded to fp32; at most 2.1 ulp from 2^f when evaluated with fmaf as below.
// cosmos3/ops/cpu.py holds the same constants (tests/cosmos3/test_ops.py checks that they agree).
constexpr float kExp2C1 = 0x1.62e42ap-1f;
constexpr float kExp2C2 = 0x1.ebf9bcp-3f;
constexpr float kExp2C3 = 0x1.c6b754p-5f;
constexpr float kExp2C4 = 0x1.3cea8ap-7f;
constexpr float kExp2C5 = 0x1.5bb9fep-10f;
// 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer (ties to even) and leaves that
// integer in the low mantissa bits.
constexpr float kRoundMagic = 0x1.8p23f;
// The exponent t = g * exp2_coef is kept in [kExp2Min, kExp2Max] (by clamping g), so that 2^round(t) * p stays
// a normal float, adding round(t) to p's exponent field is exact, and 1 + 2^t <= 2^125.5 has a normal
// reciprocal that kRecipSeed can seed. Past these bounds sigmoid is already 1 (t <= -125) or below 2^-125
// (t >= 125: for g < -86.6 / alpha, silu(g) is held at g * 2^-125.5).
constexpr double kExp2Min = -125.0;
constexpr double kExp2Max = 125.0;
// 1 / d for d in [1, 2^125.5]: the integer seed kRecipSeed - bits(d) is within 12% of 1 / d (it negates d's
// exponent and roughly inverts the mantissa); each Newton step r += r * (1 - d * r) squares the relative
// error, so three reach at most 0.5005 ulp (correctly rounded for 99.98% of d).
constexpr uint32_t kRecipSeed = 0x7EF311C3u;
constexpr int kNewtonSteps = 3;

// exp(-alpha * g) = 2^(g * exp2_coef) as 2^n * p(f), n = round(g * exp2_coef), f = g * exp2_coef - n.
__device__ __forceinline__ float exp_neg_alpha_g(float g, const SwigluScalars& s) {
  g = fminf(fmaxf(g, s.gate_min), s.gate_max);
  const float rounded = __fmaf_rn(g, s.exp2_coef, kRoundMagic);                      // kRoundMagic + n
  const float f = __fmaf_rn(g, s.exp2_coef, -__fsub_rn(rounded, kRoundMagic));      // exact product, one rounding
  float p = __fmaf_rn(kExp2C5, f, kExp2C4);
  p = __fmaf_rn(p, f, kExp2C3);
  p = __fmaf_rn(p, f, kExp2C2);
  p = __fmaf_rn(p, f, kExp2C1);
  p = __fmaf_rn(p, f, 1.f);
  // n << 23 is the exponent increment: the magic's own bits shift out past bit 31.
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(rounded) << 23));
}

// 1 / d for d in [1, 2^125.5] (see kRecipSeed), with FMAs and one integer subtraction only.
__device__ __forceinline__ float reciprocal(float d) {
  float r = __uint_as_float(kRecipSeed - __float_as_uint(d));
#pragma unroll
  for (int i = 0; i < kNewtonSteps; ++i) r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.f), r);
  return r;
}

// NaN-propagating min/max (PTX min.NaN, sm_80+), like torch.clamp; fminf would replace a NaN by the bound.
__device__ __forceinline__ float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// One element: (g * (u + beta)) * sigmoid(alpha * g), then, for FP8, times the scale's reciprocal. Not
// divide(): its two FMAs and select cost this instruction-bound kernel 97% -> 80% of copy on the H200, for
// an FP8 result that differs from a true division for about 1 element in 10 million (a tie moved by an ulp).
template <bool kLimit, bool kScaled>
struct SwigluOp {
  SwigluScalars s;

  __device__ __forceinline__ float operator()(const float (&x)[2], Divisor scale) const {
    float g = x[0];
    float u = x[1];
    if constexpr (kLimit) {
      g = min_nan(g, s.limit);
      u = min_nan(max_nan(u, -s.limit), s.limit);
    }
    const float sigmoid = reciprocal(__fadd_rn(exp_neg_alpha_g(g, s), 1.f));
    const float out = __fmul_rn(__fmul_rn(g, __fadd_rn(u, s.beta)), sigmoid);
    return kScaled ? __fmul_rn(out, scale.inv) : out;
  }
};

template <typename In, typename Out, bool kScaled>
cudaError_t launch_for_limit(const In* gate, const In* up, Out* out, const float* scale, int64_t n,
                             SwigluScalars s, LaunchConfig config, cudaStream_t stream) {
  const Inputs<In, 2> in{{gate, up}};
  if (s.has_limit) return launch_map(in, out, scale, n, SwigluOp<true, kScaled>{s}, config, stream);
  return launch_map(in, out, scale, n, SwigluOp<false, kScaled>{s}, config, stream);
}

}  // namespace

SwigluScalars swiglu_scalars(double alpha, double beta, const double* limit) {
  const float coef = -static_cast<float>(alpha) * kLog2e;
  // Bounds on g for kExp2Min <= g * coef <= kExp2Max, divided in fp64 and rounded once (as cosmos3/ops/cpu.py); no
  // bounds for alpha == 0.
  const float a = coef == 0.f ? -INFINITY : static_cast<float>(kExp2Min / coef);
  const float b = coef == 0.f ? INFINITY : static_cast<float>(kExp2Max / coef);
  return SwigluScalars{coef, std::min(a, b), std::max(a, b), static_cast<float>(beta),
                       limit != nullptr ? static_cast<float>(*limit) : 0.f, limit != nullptr};
}

cudaError_t silu_and_mul_2in(const void* gate, const void* up, void* out, const float* scale, int64_t n,
                             Dtype in_dtype, Dtype out_dtype, SwigluScalars scalars, LaunchConfig config,
                             cudaStream_t stream) {
  return dispatch_input_dtype(in_dtype, [&](auto in_type) -> cudaError_t {
    using In = decltype(in_type);
    const In* g = static_cast<const In*>(gate);
    const In* u = static_cast<const In*>(up);
    if (out_dtype == Dtype::kFloat8E4M3 && scale != nullptr) {
      return launch_for_limit<In, __nv_fp8_e4m3, true>(g, u, static_cast<__nv_fp8_e4m3*>(out), scale, n, scalars,
                                                       config, stream);
    }
    if (out_dtype == in_dtype && scale == nullptr) {
      return launch_for_limit<In, In, false>(g, u, static_cast<In*>(out), nullptr, n, scalars, config, stream);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace cosmos3
