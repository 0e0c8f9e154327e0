"""A GEN layer's norms with and without their neighbours fused in, side by side on one GPU (issue 15, T2I).

Everything of a static-FP8 Nano GEN layer but its GEMMs and attention, at a still's 1,024 tokens and a clip's
44,160 (after ``--und-tokens`` UND tokens), captured in one CUDA graph of ``--layers`` layers (as the graphed
step runs them):

* unfused (main before the fused norms): the residual add, ``F.rms_norm`` and ``quantize_fp8`` before Q/K/V and
  before gate/up, per-head ``F.rms_norm`` then rotate-half RoPE (``x * cos + roll(x) * sin``) for q and k, and
  ``torch.cat`` of the UND K/V and the GEN k, v: 16 kernels a layer;
* fused (``cosmos3.ops``): ``add_rms_norm`` with FP8 out twice and ``attention_inputs`` (q's and k's norm and
  RoPE, k and v after the UND K/V): 3 kernels.

Both compute the same values (up to the fused form's single rounding of RoPE). Prints ms per layer and the
ratio; ``--check`` also compares their outputs.

    python benchmarks/bench_norm_fusion.py [--tokens 1024 44160] [--und-tokens 40] [--layers 36]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosmos3 import ops  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 44160])
    parser.add_argument("--und-tokens", type=int, default=40, help="UND (prompt) tokens before the GEN K/V")
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--check", action="store_true", help="compare the two forms' outputs")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.layers} layers in one CUDA graph")
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


if __name__ == "__main__":
    main()
