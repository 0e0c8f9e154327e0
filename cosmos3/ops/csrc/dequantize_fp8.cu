// dequantize_fp8: W8A16's weight dequantization, out = (weight.float() * scale).to(dtype), one rounding of the
// fp32 product; the CPU impl in cosmos3/ops/cpu.py is that expression. One 16-byte load is 16 FP8 weights, and
// their 16-bit values are 32 bytes stored.
#include "cosmos3_ops.h"
#include "vec_fp8.cuh"

namespace cosmos3 {
namespace {

// The scale itself, not its reciprocal: the map's Divisor.inv goes unused (and is not computed).
struct MultiplyByScaleOp {
  __device__ __forceinline__ float operator()(const float (&x)[1], Divisor scale) const {
    return __fmul_rn(x[0], scale.scale);
  }
};

}  // namespace

cudaError_t dequantize_fp8(const void* weight, void* out, const float* scale, int64_t n, Dtype out_dtype,
                           LaunchConfig config, cudaStream_t stream) {
  return dispatch_16bit_dtype(out_dtype, [&](auto out_type) -> cudaError_t {
    using Out = decltype(out_type);
    const Inputs<__nv_fp8_e4m3, 1> in{{static_cast<const __nv_fp8_e4m3*>(weight)}};
    return launch_map(in, static_cast<Out*>(out), scale, n, MultiplyByScaleOp{}, config, stream);
  });
}

}  // namespace cosmos3
