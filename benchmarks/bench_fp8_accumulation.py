"""How FP8 GEMMs sum on the GPU: ``fp8_accumulation="fast"`` against ``"fp32"``, side by side (GPU).

``gemms``: Nano's four GEN GEMM shapes at a still's 1,024 tokens and a clip's 44,160, 36 calls over 8 weight sets
in one CUDA graph, the two accumulations alternating for ``--rounds`` (the farm worker's CUDA settings). Then, at
1,024 tokens, what each costs in accuracy, against the exact (fp64) sum of the same e4m3 operands: the error of the
accumulation alone (fp32 output), of the BF16 output the model uses, and for scale the error the e4m3 quantization
of activation-like operands makes by itself (the exact FP8 product against the product of the unquantized values).

``still``: the workload's still (1024x1024, 50 steps, guidance 7, interval (400, 1000)) of the Nano FP8 checkpoint
``bench_render.py write`` makes, in processes that alternate, ``--rounds`` of each accumulation: two warm-up stills
(graphs captured), then ``--stills`` measured. Each keeps its last still's final latents; with the BF16 variant
written too, one more process renders the still in BF16 (the same weights, dequantized) to compare against.

    python -m benchmarks.bench_render write --root /tmp/nano --variants fp8 bf16
    python -m benchmarks.bench_fp8_accumulation gemms
    python -m benchmarks.bench_fp8_accumulation still --root /tmp/nano --attention fp8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import CALLS, WEIGHT_SETS, add_still_command, graphed_us, job_request, machine
from cosmos3.rules.load_options import FP8_ACCUMULATIONS  # torch-free

SHAPES = {"q/k/v packed": (6144, 4096), "o": (4096, 4096), "gate or up": (12288, 4096), "down": (4096, 12288)}
TOKENS = (1024, 44160)  # the workload's still, its T2V clip


def relative_l2(ours, ref) -> float:
    return ((ours.double() - ref).norm() / ref.norm()).item()


def time_shape(tokens: int, n: int, k: int, rounds: int) -> dict[str, float]:
    """Median us a call of each accumulation: ``[tokens, k] x [n, k]``, both graphs timed in every round."""
    import torch

    from cosmos3.ops import FP8, FP8_MAX
    from cosmos3.quant.fp8_static import scaled_mm

    scale = torch.tensor(1.0, device="cuda")
    weights = [(torch.randn(n, k, device="cuda") * 40).clamp(-FP8_MAX, FP8_MAX).to(FP8) for _ in range(WEIGHT_SETS)]
    x = (torch.randn(tokens, k, device="cuda") * 40).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    times = {accumulation: [] for accumulation in FP8_ACCUMULATIONS}
    timers = {accumulation: graphed_us(
        lambda i, a=accumulation: scaled_mm(x, weights[i % WEIGHT_SETS], scale, scale, torch.bfloat16, accumulation=a),
        times[accumulation]) for accumulation in FP8_ACCUMULATIONS}
    for _ in range(rounds):
        for accumulation in FP8_ACCUMULATIONS:
            timers[accumulation]()
    return {accumulation: statistics.median(t) for accumulation, t in times.items()}


def gemms(args) -> None:
    import torch

    from cosmos3.ops import FP8, FP8_MAX
    from cosmos3.quant.fp8_static import scaled_mm
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()
    print(f"GPU {machine()}; {CALLS} calls over {WEIGHT_SETS} weight sets a graph, {args.rounds} rounds, "
          "no cuBLASLt workspace")
    print("| shape (tokens x K x N) | fp32 us | fast us | fast vs fp32 |")
    print("|---|---|---|---|")
    for tokens in TOKENS:
        for name, (n, k) in SHAPES.items():
            us = time_shape(tokens, n, k, args.rounds)
            torch.cuda.empty_cache()
            print(f"| {name} {tokens} x {k} x {n} | {us['fp32']:.2f} | {us['fast']:.2f} | "
                  f"{us['fp32'] / us['fast']:.3f}x |", flush=True)

    print("\nAccuracy at 1,024 tokens, relative L2 against the exact sum of the same e4m3 operands (activations "
          "N(0, 1), weights N(0, 0.02^2), each quantized per tensor at amax / 448 as ModelOpt's static recipe):")
    print("| shape | fp32: fp32 out | fast: fp32 out | fp32: bf16 out | fast: bf16 out "
          "| e4m3 quantization itself |")
    print("|---|---|---|---|---|---|")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in SHAPES.items():
        x_hp = torch.randn(1024, k, device="cuda", generator=generator)
        w_hp = torch.randn(n, k, device="cuda", generator=generator) * 0.02
        sx, sw = x_hp.abs().amax() / FP8_MAX, w_hp.abs().amax() / FP8_MAX
        x8, w8 = (x_hp / sx).to(FP8), (w_hp / sw).to(FP8)  # |values| <= 448: the casts never saturate
        exact = (x8.double() @ w8.double().t()) * (sx.double() * sw.double())
        errors = [relative_l2(scaled_mm(x8, w8, sx, sw, dtype, accumulation=accumulation), exact)
                  for dtype in (torch.float32, torch.bfloat16) for accumulation in ("fp32", "fast")]
        quantization = relative_l2(exact, x_hp.double() @ w_hp.double().t())
        print(f"| {name} (K={k}) | " + " | ".join(f"{e:.2e}" for e in errors) + f" | {quantization:.2e} |",
              flush=True)


def measure(root: Path, variant: str, accumulation: str, attention: str, stills: int, latents_path: str) -> dict:
    """One process's stills; the last one's final latents saved to ``latents_path``."""
    import torch

    from cosmos3.pipeline import Cosmos3Pipeline
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()
    pipe = Cosmos3Pipeline.from_pretrained(root / variant, device="cuda", attention=attention,
                                           fp8_accumulation=accumulation)
    vae, kept = pipe.vae, {}
    decode = vae.decode

    def keep(latents):  # the denoised latents, before the VAE
        kept["latents"] = latents.float().cpu()
        return decode(latents)

    vae.decode = keep
    request = job_request("t2i")
    warm = [sum(pipe(request).timings["steps"]) for _ in range(2)]
    steps = [sum(pipe(request).timings["steps"]) for _ in range(stills)]
    torch.save(kept["latents"], latents_path)
    return {"warm": warm, "steps": steps, "fp8_accumulation": pipe.model.fp8_accumulation}


def run_child(args, variant: str, accumulation: str, latents_path: str) -> dict:
    command = [sys.executable, "-m", "benchmarks.bench_fp8_accumulation",
               "still", "--root", str(args.root), "--attention", args.attention,
               "--stills", str(args.stills), "--child", variant, accumulation, latents_path]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{variant} {accumulation}: the child failed\n{done.stderr[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def still(args) -> None:
    if args.child is not None:
        variant, accumulation, latents_path = args.child
        print(json.dumps(measure(args.root, variant, accumulation, args.attention, args.stills, latents_path)))
        return

    import torch


    folder = Path(tempfile.mkdtemp(prefix="fp8-accumulation-"))
    runs = {accumulation: [] for accumulation in FP8_ACCUMULATIONS}
    for index in range(args.rounds):
        for accumulation in FP8_ACCUMULATIONS:
            runs[accumulation].append(run_child(args, "fp8", accumulation, str(folder / f"{accumulation}{index}.pt")))
            print(f"  {accumulation}: steps sums {', '.join(f'{s:.3f}' for s in runs[accumulation][-1]['steps'])} s",
                  flush=True)
    latents = {accumulation: torch.load(folder / f"{accumulation}0.pt") for accumulation in FP8_ACCUMULATIONS}
    if (args.root / "bf16").is_dir():
        run_child(args, "bf16", "fast", str(folder / "bf16.pt"))  # no FP8 GEMMs: the accumulation is moot
        latents["BF16 variant"] = torch.load(folder / "bf16.pt")

    print(f"GPU {machine()}; attention {args.attention}; {args.rounds} processes an accumulation, alternating")
    print("| fp8_accumulation | steps sum s, each still | median s | vs fp32 |")
    print("|---|---|---|---|")
    medians = {a: statistics.median(s for run in runs[a] for s in run["steps"]) for a in FP8_ACCUMULATIONS}
    for accumulation in FP8_ACCUMULATIONS:
        sums = ", ".join(f"{s:.3f}" for run in runs[accumulation] for s in run["steps"])
        print(f"| {accumulation} | {sums} | {medians[accumulation]:.4f} | "
              f"{medians['fp32'] / medians[accumulation]:.3f}x |")
    same = all(torch.equal(torch.load(folder / f"{a}{i}.pt"), latents[a])
               for a in FP8_ACCUMULATIONS for i in range(args.rounds))
    print(f"final latents the same in every process of an accumulation: {same}")
    names = list(latents)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            print(f"final latents, relative L2 {a} vs {b}: {relative_l2(latents[a], latents[b].double()):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("gemms").add_argument("--rounds", type=int, default=8)
    add_still_command(sub, stills=4, nargs=3)  # --child VARIANT ACCUMULATION LATENTS_PATH
    args = parser.parse_args()
    if args.command == "gemms":
        gemms(args)
    else:
        still(args)


if __name__ == "__main__":
    main()
