"""A packed static-FP8 Q/K/V (cosmos3/layers/packed.py) against split ones, side by side (GPU).

``gemms``: Nano's GEN Q/K/V as the model runs it, three per-tensor-scaled GEMMs (4,096 + 1,024 + 1,024 columns)
against one per-column-scaled GEMM of 6,144, at a sweep of token counts, 36 calls over 8 weight sets in one CUDA
graph, the two alternating for ``--rounds``. It prints the ratios and the largest swept token count up to which
packing wins at every size: the figure for ``PACKED_MAX_TOKENS``.

``still``: the workload's still (1024x1024, 50 steps, guidance 7, interval (400, 1000)) of the Nano FP8 checkpoint
``bench_render.py write`` makes, packed (the table as it is) against split (an empty table), in processes that
alternate, ``--rounds`` of each: two warm-up stills, then ``--stills`` measured.

Both run under the farm worker's CUDA settings (``worker.gpu.configure_cuda_allocator``: no cuBLASLt workspace).

    python -m benchmarks.bench_packed_gemm gemms
    python -m benchmarks.bench_render write --root /tmp/nano --variants fp8
    python -m benchmarks.bench_packed_gemm still --root /tmp/nano --attention fp8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from benchmarks.common import CALLS, WEIGHT_SETS, add_still_command, graphed_us, job_request

HIDDEN, Q_DIM, KV_DIM = 4096, 4096, 1024  # Nano's GEN tower
TOKENS = (256, 1024, 2048, 4096, 8192, 16384, 44160)  # a small still ... the T2V clip


def group_of(sizes: tuple[int, ...], seed: int):
    """Static-FP8 linears of ``sizes`` loaded with random weights and scales, and their packed group."""
    import torch

    from cosmos3.layers.linear import Linear
    from cosmos3.layers.packed import PackedProjections
    from cosmos3.quant import STATIC_FP8
    from cosmos3.quant.fp8_static import FP8

    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.device("cuda"):
        linears = [Linear(HIDDEN, n, quant_method=STATIC_FP8, dtype=torch.bfloat16) for n in sizes]
        group = PackedProjections.of(linears)
    input_scale = torch.tensor(0.02, device="cuda")
    for linear in linears:
        weight = (torch.randn(linear.out_features, HIDDEN, device="cuda", generator=g) * 50).clamp(-448, 448).to(FP8)
        scale = torch.rand((), device="cuda", generator=g) * 0.001 + 0.001
        STATIC_FP8.load_weights(linear, {"": {"weight": weight, "weight_scale": scale,
                                              "input_scale": input_scale.clone()}}, "bench")
    group.refresh()
    return linears, group


def gemms(args) -> None:
    import torch

    from cosmos3.layers import packed
    from cosmos3.quant.fp8_static import FP8

    major, minor = torch.cuda.get_device_capability()
    packed.PACKED_MAX_TOKENS[10 * major + minor] = max(args.tokens)  # the sweep packs at every size it measures
    groups = [group_of((Q_DIM, KV_DIM, KV_DIM), seed) for seed in range(WEIGHT_SETS)]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us a call (median of {args.rounds} rounds), "
          f"{CALLS} calls over {WEIGHT_SETS} weight sets in one CUDA graph\n")
    print("| tokens | Q/K/V split us | packed us | split/packed |")
    print("|---|---|---|---|")
    wins_up_to = 0
    for tokens in args.tokens:
        x = (torch.randn(tokens, HIDDEN, device="cuda") * 30).to(FP8)
        assert all(group.wants(x) for _, group in groups)

        def split(i):
            return [linear(x) for linear in groups[i % WEIGHT_SETS][0]]

        def packed_qkv(i):
            return groups[i % WEIGHT_SETS][1](x)

        # The packed group's outputs are the split ones, bit for bit (tests/cosmos3/test_packed.py asserts it too).
        assert all(torch.equal(a, b) for a, b in zip(split(0), packed_qkv(0), strict=True))
        times = {"split": [], "packed": []}
        runs = [graphed_us(split, times["split"]), graphed_us(packed_qkv, times["packed"])]
        for _ in range(args.rounds):
            for run in runs:
                run()
        med = {name: statistics.median(t) for name, t in times.items()}
        ratio = med["split"] / med["packed"]
        print(f"| {tokens:,} | {med['split']:.2f} | {med['packed']:.2f} | {ratio:.3f}x |", flush=True)
        if ratio >= 1.0 and wins_up_to == max((t for t in args.tokens if t < tokens), default=0):
            wins_up_to = tokens
        del runs  # the graphs and their pools
        torch.cuda.empty_cache()
    print(f"\npacking wins at every swept size up to {wins_up_to:,} tokens (PACKED_MAX_TOKENS)")


def still_child(args) -> None:
    """One process: the still, packed or split, printed as one JSON line."""
    from cosmos3.layers import packed

    if args.child == "split":
        packed.PACKED_MAX_TOKENS.clear()
    from cosmos3.layers.packed import PackedProjections
    from cosmos3.pipeline import Cosmos3Pipeline

    calls = []
    real = PackedProjections.__call__
    PackedProjections.__call__ = lambda self, x: calls.append(1) or real(self, x)  # counts captures and eager calls
    pipe = Cosmos3Pipeline.from_pretrained(args.root / "fp8", device="cuda", attention=args.attention)
    request = job_request("t2i")
    for _ in range(2):
        pipe(request)
    outs = [pipe(request) for _ in range(args.stills)]
    print(json.dumps({"steps": [sum(out.timings["steps"]) for out in outs],
                      "median_step": [statistics.median(out.timings["steps"]) for out in outs],
                      "packed_calls": len(calls), "frame_sum": int(outs[-1].frames.astype("int64").sum())}))


def still(args) -> None:
    results = {"packed": [], "split": []}
    for _ in range(args.rounds):
        for setting in results:
            command = [sys.executable, "-m", "benchmarks.bench_packed_gemm",
                       "still", "--root", str(args.root), "--attention", args.attention,
                       "--stills", str(args.stills), "--child", setting]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{setting}: the child failed\n{done.stderr[-3000:]}")
            result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
            results[setting].append(result)
            print(f"{setting}: steps sums {', '.join(f'{s:.4f}' for s in result['steps'])} s; packed group calls "
                  f"{result['packed_calls']}; frame sum {result['frame_sum']}", flush=True)
    medians = {setting: statistics.median(s for r in rs for s in r["steps"]) for setting, rs in results.items()}
    print(f"\nsteps sum, median over {args.rounds} x {args.stills} stills: packed {medians['packed']:.4f} s, "
          f"split {medians['split']:.4f} s: split/packed {medians['split'] / medians['packed']:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gemm_parser = sub.add_parser("gemms")
    gemm_parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    gemm_parser.add_argument("--rounds", type=int, default=5)
    add_still_command(sub, stills=3, choices=("packed", "split"))
    args = parser.parse_args()

    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # a farm GPU worker's CUDA settings, before torch touches CUDA
    if args.command == "gemms":
        gemms(args)
    elif args.child:
        still_child(args)
    else:
        still(args)


if __name__ == "__main__":
    main()
