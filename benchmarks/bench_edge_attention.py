"""What FP8 attention on the step policy's W8A16 steps costs in quality on the toy checkpoint: the demo set
(manifests/demo.yaml) rendered with BF16 attention, ``fp8`` (BF16 attention on the W8A16 steps) and
``fp8-all-steps`` (FP8 attention there too), side by side in one run, cache off so that only attention differs.

Per choice and task: PSNR of the frames against the BF16-attention render of the same job and seed, whether each
render shows its prompt (``toy.measure``, which knows nothing of the model), and for clips the SNR of the sound and
whether its pitch names the shape's colour. The toy's CPU runs ``fp8-reference`` (the FP8 kernels' quantization in
fp32 math) on every GEN pass; seconds are the GPU's to measure (``bench_render.py farm --attention``).

    python -m benchmarks.bench_edge_attention
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from benchmarks.bench_step_cache import commit, demo_pipeline, render, sound_columns, summary
from farm import manifest
from toy import measure, scenes

REPO = Path(__file__).resolve().parents[1]
CHOICES = ("fp8", "fp8-all-steps")  # each against "bf16"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", type=Path, default=REPO / "manifests" / "demo.yaml")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    demo = manifest.load(args.manifest)
    pipe = demo_pipeline(demo, attention="bf16")
    start = time.perf_counter()
    renders = {}
    for choice in ("bf16", *CHOICES):
        pipe.model.attention.use(choice)
        renders[choice] = {job.key: render(pipe, "off", job.request) for job in demo.jobs}
    seconds = time.perf_counter() - start

    print(f"# FP8 attention on the W8A16 steps, on the toy ({demo.model.checkpoint}): {len(demo.jobs)} demo jobs, "
          f"cache off, commit {commit()}, {platform.machine()} CPU, {args.threads} thread(s), {seconds:.0f} s")
    print(f"step policy: {pipe.model.step_policy_info()}\n")
    print("| job | task | " + " | ".join(f"{c}: PSNR (dB) | {c}: prompt | {c}: sound SNR (dB) | {c}: pitch"
                                         for c in CHOICES) + " |")
    print("|---|---|" + "---|---|---|---|" * len(CHOICES))
    for job in demo.jobs:
        scene, reference = scenes.scene_of(job.request.prompt), renders["bf16"][job.key]
        cells = []
        for choice in CHOICES:
            ours = renders[choice][job.key]
            hit = measure.matches(scene, measure.read(ours.frames))
            cells.append(f"{measure.psnr(ours.frames, reference.frames):.1f} | {'yes' if hit else 'NO'} | "
                         f"{sound_columns(ours, reference, scene)}")
        print(f"| {job.key} | {job.request.task} | " + " | ".join(cells) + " |")
    print("\n| choice | task | median / min PSNR (dB) | prompt match | median / min sound SNR (dB) | pitch names the "
          "colour |")
    print("|---|---|---|---|---|---|")
    for choice in CHOICES:
        for task in ("t2i", "t2v"):
            jobs = [job for job in demo.jobs if job.request.task == task]
            s = summary(jobs, renders["bf16"], renders[choice])
            sound = "– | –" if s["sound"] is None else "{:.1f} / {:.1f} | {:.0%}".format(*s["sound"])
            print(f"| {choice} | {task} | {s['median']:.1f} / {s['min']:.1f} | {s['match']:.0%} | {sound} |")


if __name__ == "__main__":
    main()
