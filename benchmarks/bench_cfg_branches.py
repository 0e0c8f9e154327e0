"""Issue 15's still with CFG's two branches in one GEN pass (the product) against one pass per branch, side by side
in one process (GPU).

A still's cond and uncond branches share their latents and differ in their prompt. Run as one pass over both
branches' 2 x 1,024 tokens (``cosmos3.transformer.BATCH_MAX_TOKENS``), each FP8 weight is read once a step instead
of twice, each GEMM runs twice the rows and a step launches half the kernels; their attention runs in one FA3
call over both branches' sequences where FA3 is installed, else branch by branch (a third setting measures that
on FA3 too). Per branch, the pass is the one before. The settings run on one loaded pipeline (their CUDA graphs
are captured apart), alternating still by still after two warm-ups each, with the farm worker's CUDA settings;
NVML samples the SM clock and power meanwhile (the H200 runs a still at its 700 W cap,
benchmarks/results/h200-2026-12-02-session17.md).

    python benchmarks/bench_render.py write --root /tmp/nano --variants fp8
    python benchmarks/bench_cfg_branches.py /tmp/nano [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name -> (BATCH_MAX_TOKENS, None: the product's; whether attention may take both branches in one call)
SETTINGS = {"one pass, both branches": (None, True), "one pass, attention branch by branch": (None, False),
            "one pass per branch": (0, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="bench_render.py write's --root")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # a farm GPU worker's allocator, set before torch touches CUDA
    import numpy as np
    import torch

    import cosmos3.transformer
    from benchmarks.bench_render import JOBS, PROMPT
    from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest
    from worker.gpu_telemetry import Sampler, open_device

    product = cosmos3.transformer.BATCH_MAX_TOKENS
    pipe = Cosmos3Pipeline.from_pretrained(args.root / "fp8", device="cuda", attention="fp8")
    still = {k: v for k, v in JOBS["t2i"].items() if k not in ("id", "priority", "size")}
    request = RenderRequest(prompt=PROMPT, width=1024, height=1024, **still)
    device = open_device(str(torch.cuda.get_device_properties(0).uuid))

    attention = pipe.model.attention

    def render(setting):
        batch, ragged = setting
        cosmos3.transformer.BATCH_MAX_TOKENS = product if batch is None else batch
        if ragged:
            vars(attention).pop("gen_ragged_here", None)  # the class's own
        else:
            attention.gen_ragged_here = lambda device, queries: False
        with Sampler(device) as sampler:
            out = pipe(request)
        return out, sampler.summary()

    for setting in SETTINGS.values():  # captures their graphs, twice over
        render(setting)
        render(setting)
    sums = {name: [] for name in SETTINGS}
    clocks = {name: [] for name in SETTINGS}
    frames = {}
    for _ in range(args.rounds):
        for name, setting in SETTINGS.items():
            out, telemetry = render(setting)
            sums[name].append(sum(out.timings["steps"]))
            clocks[name].append(telemetry["sm_clock_mhz_median"])
            frames[name] = out.frames

    props = torch.cuda.get_device_properties(0)
    info = out.info
    print(f"GPU {props.name}, torch {torch.__version__}; {info['width']}x{info['height']}, {info['steps']} steps, "
          f"guidance {info['guidance']} in {info['guidance_interval']}; attention {info['attention']}; "
          f"{args.rounds} rounds")
    print("| CFG branches | steps sum s, each still | median s | SM clock median MHz | vs one pass per branch |")
    print("|---|---|---|---|---|")
    base = statistics.median(sums["one pass per branch"])
    for name in SETTINGS:
        median = statistics.median(sums[name])
        clock = statistics.median(c for c in clocks[name] if c is not None) if any(clocks[name]) else float("nan")
        print(f"| {name} | {', '.join(f'{s:.3f}' for s in sums[name])} | {median:.4f} | {clock:.0f} | "
              f"{base / median:.3f}x |")
    apart = frames["one pass per branch"].astype(int)
    for name in SETTINGS:
        if name != "one pass per branch":
            diff = np.abs(frames[name].astype(int) - apart)
            print(f"frames, {name} vs one pass per branch: equal {bool((diff == 0).all())}, max |difference| "
                  f"{diff.max()}, mean {diff.mean():.4f} (of 255)")


if __name__ == "__main__":
    main()
