"""The custom CUDA ops (``cosmos3.ops``) on this GPU, side by side with what they replace (needs CUDA).

``bandwidth``: silu_and_mul_2in, quantize_fp8 and dequantize_fp8 against the copy ceiling, torch.compile and eager
PyTorch. Prints the device-to-device copy bandwidth measured in this run, then per shape and output: the op's
median time, its effective bandwidth (bytes read + written / time), that as a percentage of the copy bandwidth and
of a copy moving the same number of bytes (small shapes pay launch and tail costs a 4 GiB copy does not), and how
many times faster it is than torch.compile and than eager PyTorch of the same formula. Times are medians of
CUDA-event-timed runs after warm-up (each at least 25 ms of GPU work).

``launch``: every (threads per block, vectors per thread) the elementwise kernels accept, on M x I = 32760 x 16384
bf16 inputs (dequantize_fp8: their FP8 quantization, to bf16): per config the median time and the percentage of
the copy bandwidth; then the best row for this SM version, to paste into cosmos3/ops/launch_table.py. silu_and_mul_2in
is ranked by its FP8-output time (the static-FP8 MLP path); its bf16-output time is shown beside it.

``norms``: everything of a static-FP8 Nano GEN layer but its GEMMs and attention, at a still's 1,024 tokens and a
clip's 44,160 (after ``--und-tokens`` UND tokens), ``--layers`` layers in one CUDA graph (as the graphed step runs
them), unfused against fused:

* unfused: the residual add, ``F.rms_norm`` and ``quantize_fp8`` before Q/K/V and before gate/up, per-head
  ``F.rms_norm`` then rotate-half RoPE (``x * cos + roll(x) * sin``) for q and k, and ``torch.cat`` of the UND K/V
  and the GEN k, v: 16 kernels a layer;
* fused (``cosmos3.ops``): ``add_rms_norm`` with FP8 out twice and ``attention_inputs`` (q's and k's norm and RoPE,
  k and v after the UND K/V): 3 kernels.

Both compute the same values (up to the fused form's single rounding of RoPE). Prints ms per layer and the ratio;
``--check`` also compares their outputs.

    python -m benchmarks.bench_ops bandwidth [--reps 30]
    python -m benchmarks.bench_ops launch [--reps 50]
    python -m benchmarks.bench_ops norms [--tokens 1024 44160] [--und-tokens 40] [--layers 36] [--check]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.common import machine
from cosmos3 import ops
from cosmos3.ops import loader as ops_loader
from cosmos3.ops.cpu import dequantize_fp8 as dequantize  # the reference expression, eager or compiled
from cosmos3.ops.launch_table import LaunchParams

SHAPES = [(32760, 16384), (8192, 16384), (1760, 12288)]  # [M, I]: Cosmos3 MLP activations
COPY_BYTES = 4 << 30
SCALE = 0.02


def median_ms(fn: Callable[[], object], reps: int, min_total_ms: float = 25.0) -> float:
    """Median CUDA-event time of ``fn``. Warm-up and timed runs each last at least ``min_total_ms`` of GPU
    time (a short kernel gets more runs), so clocks have settled and short kernels are not timed cold."""
    fn()  # first call: build, compile, allocate
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    runs = max(reps, math.ceil(min_total_ms / max(start.elapsed_time(end), 1e-3)))
    for _ in range(runs):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def copy_tbps(reps: int, nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy bandwidth of an ``nbytes`` copy, bytes read plus written, in TB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / median_ms(lambda: dst.copy_(src), reps) / 1e9


def swiglu_formula(gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    y = F.silu(gate.float()) * up.float()
    return y.to(gate.dtype) if scale is None else (y / scale).clamp(-448, 448).to(ops.FP8)


def quantize_formula(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-448, 448).to(ops.FP8)


@dataclass
class Case:
    name: str
    ours: Callable[[], torch.Tensor]
    formula: Callable[..., torch.Tensor]
    args: tuple
    bytes_moved: int


def cases(m: int, i: int) -> list[Case]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate = (torch.randn(m, i, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    up = (torch.randn(m, i, device="cuda", generator=gen) * 2).to(torch.bfloat16)
    scale = torch.tensor([SCALE], device="cuda")
    weight = ops.quantize_fp8(gate, scale)
    n = m * i
    return [
        Case("swiglu bf16->fp8", lambda: ops.silu_and_mul_2in(gate, up, scale=scale), swiglu_formula,
             (gate, up, scale), 5 * n),
        Case("swiglu bf16->bf16", lambda: ops.silu_and_mul_2in(gate, up), swiglu_formula, (gate, up, None), 6 * n),
        Case("quantize bf16->fp8", lambda: ops.quantize_fp8(gate, scale), quantize_formula, (gate, scale), 3 * n),
        Case("dequant fp8->bf16", lambda: ops.dequantize_fp8(weight, scale, torch.bfloat16), dequantize,
             (weight, scale, torch.bfloat16), 3 * n),
    ]


def bandwidth(args) -> None:
    ops.load_cuda_ops()
    compiled = {f: torch.compile(f, fullgraph=True) for f in (swiglu_formula, quantize_formula, dequantize)}
    copy = copy_tbps(args.reps)
    print(machine())
    print(f"device-to-device copy: {copy:.2f} TB/s (read + write, {COPY_BYTES >> 30} GiB, median of {args.reps})")
    print(f"| {'M x I':>13} | {'op':<18} | {'ours ms':>8} | {'TB/s':>5} | {'% copy':>6} | {'% same-size copy':>16} | "
          f"{'compile ms':>10} | {'x compile':>9} | {'eager ms':>8} | {'x eager':>7} |")
    print(f"|{'-' * 15}|{'-' * 20}|{'-' * 10}|{'-' * 7}|{'-' * 8}|{'-' * 18}|{'-' * 12}|{'-' * 11}|{'-' * 10}|"
          f"{'-' * 9}|")
    for m, i in SHAPES:
        for case in cases(m, i):
            ours = median_ms(case.ours, args.reps)
            comp = median_ms(lambda: compiled[case.formula](*case.args), args.reps)
            eager = median_ms(lambda: case.formula(*case.args), 3)
            tbps = case.bytes_moved / ours / 1e9
            same_size = copy_tbps(args.reps, case.bytes_moved // 2)  # a copy reads and writes half each
            print(f"| {f'{m} x {i}':>13} | {case.name:<18} | {ours:8.3f} | {tbps:5.2f} | {100 * tbps / copy:5.1f}% | "
                  f"{100 * tbps / same_size:15.1f}% | {comp:10.3f} | {comp / ours:8.2f}x | {eager:8.3f} | "
                  f"{eager / ours:6.1f}x |")
        torch.cuda.empty_cache()



CONFIGS = [LaunchParams(t, v) for t in (64, 128, 256, 512, 1024) for v in (1, 2, 4) if t * v <= 1024]


def sweep(ext, sm: int, op: str, variants: dict[str, tuple], reps: int, copy: float) -> LaunchParams:
    """Times op under every config; variants maps a column name to (callable, bytes moved). The first ranks."""
    print(f"\n{op}")
    print("| threads | vectors/thread | " + " | ".join(f"{name} ms | % copy" for name in variants) + " |")
    best, best_ms = None, float("inf")
    for params in CONFIGS:
        ops_loader.set_launch_params(ext, sm, {op: params})
        times = [median_ms(fn, reps) for fn, _ in variants.values()]
        cells = [f"{ms:.4f} | {100 * nbytes / ms / 1e9 / copy:5.1f}%"
                 for ms, (_, nbytes) in zip(times, variants.values(), strict=True)]
        print(f"| {params.threads:7d} | {params.vectors_per_thread:14d} | " + " | ".join(cells) + " |")
        if times[0] < best_ms:
            best, best_ms = params, times[0]
    print(f"best: {best} at {best_ms:.4f} ms")
    return best


def launch(args) -> None:
    m, i = SHAPES[0]
    ext = ops.load_cuda_ops().module
    sm = ops_loader.sm_version(torch.cuda.current_device())
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate = (torch.randn(m, i, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    up = (torch.randn(m, i, device="cuda", generator=gen) * 2).to(torch.bfloat16)
    scale = torch.tensor([0.02], device="cuda")
    weight = ops.quantize_fp8(gate, scale)
    n = m * i
    copy = copy_tbps(args.reps)
    print(machine())
    print(f"M x I = {m} x {i}, bf16 inputs; copy {copy:.2f} TB/s; median of {args.reps} runs per cell")

    row = {
        "silu_and_mul_2in": sweep(ext, sm, "silu_and_mul_2in", {
            "fp8 out": (lambda: ops.silu_and_mul_2in(gate, up, scale=scale), 5 * n),
            "bf16 out": (lambda: ops.silu_and_mul_2in(gate, up), 6 * n),
        }, args.reps, copy),
        "quantize_fp8": sweep(ext, sm, "quantize_fp8", {
            "bf16 in": (lambda: ops.quantize_fp8(gate, scale), 3 * n),
        }, args.reps, copy),
        "dequantize_fp8": sweep(ext, sm, "dequantize_fp8", {
            "bf16 out": (lambda: ops.dequantize_fp8(weight, scale, torch.bfloat16), 3 * n),
        }, args.reps, copy),
    }
    print(f"\nlaunch_table.py row for sm_{sm}:")
    print(f"    {sm}: {{" + ", ".join(f'"{op}": LaunchParams(threads={p.threads}, vectors_per_thread='
                                     f'{p.vectors_per_thread})' for op, p in row.items()) + "},")


HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EPS = 4096, 32, 8, 128, 1e-6


def layer_tensors(tokens: int, und_tokens: int, seed: int = 0) -> dict:
    g = torch.Generator("cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda").bfloat16()

    angles = torch.rand(tokens, HEAD_DIM // 2, generator=g, device="cuda") * 100
    angles = torch.cat([angles, angles], dim=-1)
    signed = torch.cat([-angles[:, : HEAD_DIM // 2], angles[:, HEAD_DIM // 2:]], dim=-1)
    return {"x": randn(tokens, HIDDEN), "attn": randn(tokens, HIDDEN), "mlp": randn(tokens, HIDDEN),
            "q": randn(tokens, HEADS, HEAD_DIM), "k": randn(tokens, KV_HEADS, HEAD_DIM),
            "w": torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16), "wq": randn(HEAD_DIM).abs(),
            "wk": randn(HEAD_DIM).abs(), "cos": angles.cos().bfloat16(), "sin": signed.sin().bfloat16(),
            "scale": torch.tensor([0.05], device="cuda"), "v": randn(tokens, KV_HEADS, HEAD_DIM),
            "k_und": randn(und_tokens, KV_HEADS, HEAD_DIM), "v_und": randn(und_tokens, KV_HEADS, HEAD_DIM)}


def unfused(t: dict) -> tuple:
    def rope(x):
        return torch.addcmul(x * t["cos"][:, None], x.roll(HEAD_DIM // 2, dims=-1), t["sin"][:, None])

    x = t["x"] + t["mlp"]
    h = ops.quantize_fp8(F.rms_norm(x, (HIDDEN,), t["w"], EPS), t["scale"])
    q = rope(F.rms_norm(t["q"], (HEAD_DIM,), t["wq"], EPS))
    k = torch.cat([t["k_und"], rope(F.rms_norm(t["k"], (HEAD_DIM,), t["wk"], EPS))])
    v = torch.cat([t["v_und"], t["v"]])
    x = x + t["attn"]
    h2 = ops.quantize_fp8(F.rms_norm(x, (HIDDEN,), t["w"], EPS), t["scale"])
    return x, h, q, k, v, h2


def fused(t: dict) -> tuple:
    x, h = ops.add_rms_norm(t["x"], t["mlp"], t["w"], EPS, scale=t["scale"])
    q, k, v = ops.attention_inputs(t["q"], t["k"], t["v"], t["wq"], t["wk"], EPS, t["cos"], t["sin"], t["k_und"],
                                   t["v_und"])
    x, h2 = ops.add_rms_norm(x, t["attn"], t["w"], EPS, scale=t["scale"])
    return x, h, q, k, v, h2


def graphed_ms(form, t: dict, layers: int, iters: int) -> float:
    """Median ms of one replay of a graph running ``form`` ``layers`` times."""
    form(t)  # loads kernels, warms the allocator
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            form(t)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def norms(args) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{machine()}; {args.layers} layers in one CUDA graph")
    print("| GEN tokens | unfused ms/layer (16 kernels) | fused ms/layer (3 kernels) | fused speedup | "
          f"saved per {args.layers}-layer forward, ms |")
    print("|---|---|---|---|---|")
    for tokens in args.tokens:
        t = layer_tensors(tokens, args.und_tokens)
        if args.check:
            for name, a, b in zip(("x", "h", "q", "k", "v", "h2"), unfused(t), fused(t), strict=True):
                diff = (a.float() - b.float()).abs().max().item()
                print(f"  check {tokens} {name}: max |unfused - fused| = {diff:.3g}")
        slow = graphed_ms(unfused, t, args.layers, args.iters) / args.layers
        fast = graphed_ms(fused, t, args.layers, args.iters) / args.layers
        print(f"| {tokens:,} | {slow:.4f} | {fast:.4f} | {slow / fast:.2f}x | {(slow - fast) * args.layers:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bandwidth").add_argument("--reps", type=int, default=30)
    sub.add_parser("launch").add_argument("--reps", type=int, default=50)
    norms_parser = sub.add_parser("norms")
    norms_parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 44160])
    norms_parser.add_argument("--und-tokens", type=int, default=40, help="UND (prompt) tokens before the GEN K/V")
    norms_parser.add_argument("--layers", type=int, default=36)
    norms_parser.add_argument("--iters", type=int, default=20)
    norms_parser.add_argument("--check", action="store_true", help="compare the two forms' outputs")
    args = parser.parse_args()
    {"bandwidth": bandwidth, "launch": launch, "norms": norms}[args.command](args)


if __name__ == "__main__":
    main()
