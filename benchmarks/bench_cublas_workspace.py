"""cuBLASLt with torch's default workspace against none, the farm worker's setting (GPU).

``worker.gpu.configure_cuda_allocator`` sets ``CUBLASLT_WORKSPACE_SIZE=0``. torch reads it once, at its first
cuBLASLt call, so each setting runs in a process of its own; the processes alternate, ``--rounds`` of each. A
process loads the FP8 Nano checkpoint that ``bench_render.py write`` makes and measures:

* the workload's still (1024x1024, 50 steps, guidance 7, interval (400, 1000)): two warm-up stills (the GEN graphs
  captured in the first, the UND graphs in the second), then ``--stills`` measured: the steps' sum and the UND
  pass;
* in two profiled steps of a still, the cuBLAS workspace memsets and the GEMM kernels cuBLAS picked;
* a clip-size GEN forward (the T2V job's 44,160 tokens, eager as a long job's), W8A8 and W8A16.

    python -m benchmarks.bench_render write --root /tmp/nano --variants fp8
    python -m benchmarks.bench_cublas_workspace --root /tmp/nano [--rounds 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import job_request, machine
from cosmos3.rules.attention_choice import ATTENTION_CHOICES  # torch-free

SETTINGS = ("torch default", "none (the worker's)")


def measure(root: Path, attention: str, stills: int) -> dict:
    """One process's figures, under the CUBLASLT_WORKSPACE_SIZE it was started with."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cosmos3.pipeline import Cosmos3Pipeline
    from cosmos3.rules.request import resolve

    pipe = Cosmos3Pipeline.from_pretrained(root / "fp8", device="cuda", attention=attention)
    request = job_request("t2i")
    for _ in range(2):
        pipe(request)
    outs = [pipe(request) for _ in range(stills)]

    profiler = profile(activities=[ProfilerActivity.CUDA])

    def window(step: int, _steps: int) -> None:  # step i has run on the GPU; the host is one step ahead
        if step == 20:
            profiler.start()
        if step == 22:
            torch.cuda.synchronize()
            profiler.stop()

    pipe(request, callback=window)
    kernels = collections.Counter()
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and (event.name.startswith("nvjet")
                                                                     or event.name.startswith("Memset")):
            kernels[event.name] += 1

    plan = resolve(job_request("t2v"), pipe.rules)
    ids = pipe._token_ids(plan)[0]
    shape = pipe._vae.config.latent_shape(plan.frames, plan.height, plan.width)
    model = pipe.model
    model.prepare_gen(shape, None)
    cache = model.encode_text(ids)
    latents = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward(step: int) -> float:
        model.set_denoising_step(step, plan.steps)  # step 0 is W8A16 under the published policy
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        model(ids, latents, 500.0, fps=plan.fps, und_cache=cache)
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end) / 1e3

    w8a8 = [forward(10) for _ in range(2)]
    return {"steps": [sum(out.timings["steps"]) for out in outs], "und": [out.timings["und"] for out in outs],
            "kernels": dict(kernels), "clip_w8a8": min(w8a8), "clip_w8a16": forward(0)}


def run_child(setting: str, args) -> dict:
    env = dict(os.environ)
    env.pop("CUBLASLT_WORKSPACE_SIZE", None)
    command = [sys.executable, "-m", "benchmarks.bench_cublas_workspace",
               "--root", str(args.root), "--attention", args.attention,
               "--stills", str(args.stills), "--child", setting]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{setting}: the child failed\n{done.stderr[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="bench_render.py write's --root")
    parser.add_argument("--attention", default="fp8", choices=ATTENTION_CHOICES)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stills", type=int, default=3)
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child is not None:
        from worker.gpu import configure_cuda_allocator

        configure_cuda_allocator()  # the worker's settings, before torch touches CUDA
        if args.child == SETTINGS[0]:
            del os.environ["CUBLASLT_WORKSPACE_SIZE"]
        print(json.dumps(measure(args.root, args.attention, args.stills)))
        return


    runs = {setting: [] for setting in SETTINGS}
    for _ in range(args.rounds):
        for setting in SETTINGS:
            runs[setting].append(run_child(setting, args))
            print(f"  {setting}: steps sums {', '.join(f'{s:.3f}' for s in runs[setting][-1]['steps'])} s",
                  flush=True)
    print(f"GPU {machine()}; attention {args.attention}; {args.rounds} processes a setting, alternating")
    print("| cuBLASLt workspace | still: steps sum s, median | UND s, median | memsets in 2 CFG steps "
          "| clip forward W8A8 s | clip forward W8A16 s | still vs none |")
    print("|---|---|---|---|---|---|---|")
    medians = {s: statistics.median(x for run in runs[s] for x in run["steps"]) for s in SETTINGS}
    for setting in SETTINGS:
        rows = runs[setting]
        memsets = [sum(n for name, n in run["kernels"].items() if name.startswith("Memset")) for run in rows]
        print(f"| {setting} | {medians[setting]:.4f} | {statistics.median(x for r in rows for x in r['und']):.4f} | "
              f"{', '.join(map(str, memsets))} | {statistics.median(r['clip_w8a8'] for r in rows):.3f} | "
              f"{statistics.median(r['clip_w8a16'] for r in rows):.3f} | "
              f"{medians[setting] / medians[SETTINGS[1]]:.3f}x |")
    for setting in SETTINGS:
        gemms = {name: n for name, n in runs[setting][0]["kernels"].items() if name.startswith("nvjet")}
        print(f"{setting}: GEMM kernels in 2 CFG steps: " + "; ".join(f"{n} x{c}" for n, c in sorted(gemms.items())))


if __name__ == "__main__":
    main()
