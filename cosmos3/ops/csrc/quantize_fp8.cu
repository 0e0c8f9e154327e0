// quantize_fp8: static per-tensor quantization, out = saturate_fp8(x / scale) rounded to nearest even; the
// CPU impl in cosmos3/ops/cpu.py is (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).
#include "cosmos3_ops.h"
#include "vec_fp8.cuh"

namespace cosmos3 {
namespace {

// A true division, as the spec's x / scale (the reciprocal-multiply shortcut differs in the last bit).
struct DivideByScaleOp {
  __device__ __forceinline__ float operator()(const float (&x)[1], Divisor scale) const { return divide(x[0], scale); }
};

}  // namespace

cudaError_t quantize_fp8(const void* x, void* out, const float* scale, int64_t n, Dtype in_dtype,
                         LaunchConfig config, cudaStream_t stream) {
  return dispatch_input_dtype(in_dtype, [&](auto in_type) -> cudaError_t {
    using In = decltype(in_type);
    const Inputs<In, 1> in{{static_cast<const In*>(x)}};
    return launch_map(in, static_cast<__nv_fp8_e4m3*>(out), scale, n, DivideByScaleOp{}, config, stream);
  });
}

}  // namespace cosmos3
