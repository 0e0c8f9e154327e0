"""Every cuBLASLt algorithm the heuristic offers for Nano's static-FP8 GEN GEMMs against ``torch._scaled_mm``
(which takes the heuristic's first), side by side (GPU; issue 15).

The question: at a still's 1,024 tokens the H200 runs its FP8 GEMMs at the 700 W power cap
(benchmarks/results/h200-2026-12-02-session17.md), so an algorithm that moves less data per FLOP could hold a
higher clock and beat the one the heuristic ranks first by its model of an unthrottled chip. Each of Nano's four
GEN GEMM shapes (packed Q/K/V, O, gate or up, down) runs ``CALLS`` calls over ``WEIGHT_SETS`` weight sets in one
CUDA graph (bench_packed_gemm.graphed_us), under the farm worker's CUDA settings (no cuBLASLt workspace), every
candidate once a round for ``--rounds`` rounds. Each algorithm's output is compared with torch's bit for bit.

The algorithms come from a small extension compiled on first use against the CUDA toolkit's cuBLASLt (needs
nvcc's headers and libcublasLt, as on the H200 dev machine; not the product's build).

    python benchmarks/bench_cublaslt_algos.py [--tokens 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_packed_gemm import CALLS, WEIGHT_SETS, graphed_us  # noqa: E402

SHAPES = {"q/k/v packed": (6144, 4096), "o": (4096, 4096), "gate or up": (12288, 4096), "down": (4096, 12288)}
MAX_ALGOS = 16

# y[M, N] = x[M, K] @ w[N, K]^T as torch._scaled_mm calls cuBLASLt: column-major, A = w (op T), B = x, D = y^T.
EXTENSION = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>
#include <cstring>
#include <vector>

#define CHECK_LT(x) do { auto s_ = (x); TORCH_CHECK(s_ == CUBLAS_STATUS_SUCCESS, #x, " -> ", int(s_)); } while (0)

static cublasLtHandle_t handle() {
  static cublasLtHandle_t h = nullptr;
  if (!h) CHECK_LT(cublasLtCreate(&h));
  return h;
}

struct Problem {  // the descriptors of one call; scales are device pointers, as torch passes them
  cublasLtMatmulDesc_t op; cublasLtMatrixLayout_t a, b, d;
  Problem(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& sx, const torch::Tensor& sw) {
    int64_t m = w.size(0), n = x.size(0), k = x.size(1);
    const void* sa = sw.data_ptr(); const void* sb = sx.data_ptr();
    cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof(nt)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
    CHECK_LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, m, k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, k, n, k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, m, n, m));
  }
  ~Problem() {
    cublasLtMatrixLayoutDestroy(d); cublasLtMatrixLayoutDestroy(b); cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
  }
};

// The heuristic's algorithms for a call with no workspace (the worker's setting), best first, as byte tensors.
std::vector<torch::Tensor> algos(torch::Tensor x, torch::Tensor w, torch::Tensor sx, torch::Tensor sw, int64_t most) {
  Problem p(x, w, sx, sw);
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t workspace = 0;
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                sizeof(workspace)));
  std::vector<cublasLtMatmulHeuristicResult_t> found(most);
  int count = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(handle(), p.op, p.a, p.b, p.d, p.d, pref, most, found.data(), &count));
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<torch::Tensor> out;
  for (int i = 0; i < count; ++i) {
    if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto bytes = torch::empty({(int64_t)sizeof(cublasLtMatmulAlgo_t)}, torch::kUInt8);
    std::memcpy(bytes.data_ptr(), &found[i].algo, sizeof(cublasLtMatmulAlgo_t));
    out.push_back(bytes);
  }
  return out;
}

void run(torch::Tensor x, torch::Tensor w, torch::Tensor sx, torch::Tensor sw, torch::Tensor y, torch::Tensor algo) {
  Problem p(x, w, sx, sw);
  cublasLtMatmulAlgo_t chosen;
  std::memcpy(&chosen, algo.data_ptr(), sizeof(chosen));
  float alpha = 1.f, beta = 0.f;
  CHECK_LT(cublasLtMatmul(handle(), p.op, &alpha, w.data_ptr(), p.a, x.data_ptr(), p.b, &beta, y.data_ptr(), p.d,
                          y.data_ptr(), p.d, &chosen, nullptr, 0, at::cuda::getCurrentCUDAStream()));
}
"""


def load_extension():
    from torch.utils.cpp_extension import CUDA_HOME, load_inline

    return load_inline("cublaslt_algos", cpp_sources=EXTENSION, functions=["algos", "run"],
                       extra_include_paths=[f"{CUDA_HOME}/include"],
                       extra_ldflags=[f"-L{CUDA_HOME}/lib64", "-lcublasLt", "-lcudart"])


def kernel_name(call) -> str:
    """The GPU kernel one ``call()`` launches (the profiler's name, shortened)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return " + ".join(n.split("(")[0].removeprefix("void ")[:60] for n in names) or "?"


def measure_shape(ext, tokens: int, n: int, k: int, rounds: int) -> list[dict]:
    import torch

    from cosmos3.quant.fp8_static import FP8, FP8_MAX

    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = (torch.randn(tokens, k, device="cuda", generator=g) * 30).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    sx = torch.tensor(0.02, device="cuda")
    weights = [((torch.randn(n, k, device="cuda", generator=g) * 50).clamp(-FP8_MAX, FP8_MAX).to(FP8),
                torch.rand((), device="cuda", generator=g) * 0.001 + 0.001) for _ in range(WEIGHT_SETS)]
    outs = [torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16) for _ in range(WEIGHT_SETS)]

    def torch_call(i: int) -> None:
        w, sw = weights[i % WEIGHT_SETS]
        torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16, use_fast_accum=False,
                         out=outs[i % WEIGHT_SETS])

    def algo_call(algo):
        def call(i: int) -> None:
            w, sw = weights[i % WEIGHT_SETS]
            ext.run(x, w, sx, sw, outs[i % WEIGHT_SETS], algo)
        return call

    torch_call(0)
    expected = outs[0].clone()
    candidates = [("torch._scaled_mm", torch_call)]
    w0, sw0 = weights[0]
    candidates += [(f"heuristic #{i}", algo_call(a)) for i, a in enumerate(ext.algos(x, w0, sx, sw0, MAX_ALGOS))]
    rows = []
    for label, call in candidates:
        outs[0].zero_()
        call(0)
        rows.append({"label": label, "exact": torch.equal(outs[0], expected), "kernel": kernel_name(lambda: call(0)),
                     "times": []})
        rows[-1]["time_once"] = graphed_us(call, rows[-1]["times"])
    for _ in range(rounds):
        for row in rows:
            row["time_once"]()
    for row in rows:
        row["us"] = statistics.median(row.pop("times"))
        del row["time_once"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # the worker's CUDA settings, before torch starts CUDA: no cuBLASLt workspace
    import torch

    ext = load_extension()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUBLASLT_WORKSPACE_SIZE="
          f"{os.environ['CUBLASLT_WORKSPACE_SIZE']}; {args.tokens:,} tokens; us a call, median of {args.rounds} "
          f"rounds, {CALLS} calls over {WEIGHT_SETS} weight sets in one CUDA graph")
    for name, (n, k) in SHAPES.items():
        rows = measure_shape(ext, args.tokens, n, k, args.rounds)
        base = rows[0]["us"]
        print(f"\n{name}: [{args.tokens}, {k}] x [{k}, {n}]\n")
        print("| algorithm | kernel | us | torch / it | TFLOP/s | output equals torch's |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            tflops = 2 * args.tokens * n * k / row["us"] / 1e6
            print(f"| {row['label']} | `{row['kernel']}` | {row['us']:.2f} | {base / row['us']:.3f}x | {tflops:.0f} | "
                  f"{row['exact']} |", flush=True)
        best = max(rows[1:], key=lambda r: base / r["us"], default=None)
        if best is not None:
            print(f"\nbest of the heuristic's {len(rows) - 1}: {best['label']}, {base / best['us']:.3f}x torch's")


if __name__ == "__main__":
    main()
