"""What SeaCache costs in quality on the toy checkpoint: the demo set (manifests/demo.yaml) rendered uncached and
with SeaCache, side by side in one run.

Per render: PSNR of the cached frames against the uncached ones (same job, same seed), whether each still shows
its prompt (``toy.measure``, which knows nothing of the model), and how many steps were cached; for clips also the
SNR of the cached sound against the uncached and whether its pitch still names the shape's colour. Then a threshold
sweep with PSNR, sound SNR and steps saved side by side. Seconds are the GPU's to measure (h200-step-cache.md):
the toy's steps on a shared CPU time nothing but noise. Stills and clips run the cache alike.

    python -m benchmarks.bench_step_cache [--thresholds 0.1 0.25 0.4] [--default 0.25]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosmos3.pipeline import Cosmos3Pipeline
from cosmos3.rules.cache_options import parse_cache
from cosmos3.rules.request import RenderRequest
from farm import manifest
from toy import measure, scenes

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Render:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    sound: np.ndarray | None  # float32 [channels, N]; None for stills
    rate: int | None  # Hz
    cached: int  # steps cached
    steps: int

    def sounds(self, scene: scenes.Scene) -> bool:
        """Its sound's pitch names the scene's shape colour (a clip's tone: ``toy.scenes.PITCHES``)."""
        return measure.colour_of_pitch(measure.pitch(self.sound, self.rate)) == scene.colour


def render(pipe: Cosmos3Pipeline, cache, request: RenderRequest) -> Render:
    pipe.cache = parse_cache(cache)
    out = pipe(request)
    info = out.info["cache"]
    return Render(out.frames, out.sound, out.sampling_rate, 0 if info is None else len(info["cached"]),
                  out.info["steps"])


def demo_pipeline(demo, **overrides) -> Cosmos3Pipeline:
    """The toy's pipeline on the CPU as ``demo``'s ``model:`` loads it, ``overrides`` on top; no step cache set here:
    ``render`` sets one per render."""
    options = {k: v for k, v in vars(demo.model.options).items() if k != "cache"}
    return Cosmos3Pipeline.from_pretrained(demo.model.checkpoint, device="cpu", **{**options, **overrides})


def commit() -> str:
    """The short hash of this tree's HEAD, for a result's heading."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=REPO).stdout.strip()


def run(jobs, pipe: Cosmos3Pipeline, thresholds: list[float]) -> tuple[dict, dict]:
    """Uncached and per-threshold renders of every job: ``{key: Render}`` and ``{threshold: {key: Render}}``."""
    uncached = {job.key: render(pipe, "off", job.request) for job in jobs}
    cached = {th: {job.key: render(pipe, {"method": "seacache", "threshold": th}, job.request) for job in jobs}
              for th in thresholds}
    return uncached, cached


def summary(jobs, uncached: dict, cached: dict) -> dict:
    values = [measure.psnr(cached[job.key].frames, uncached[job.key].frames) for job in jobs]
    hits = [measure.matches(scenes.scene_of(job.request.prompt), measure.read(cached[job.key].frames)) for job in jobs]
    heard = [job for job in jobs if cached[job.key].sound is not None]
    snrs = [measure.snr(uncached[job.key].sound, cached[job.key].sound) for job in heard]
    pitched = [cached[job.key].sounds(scenes.scene_of(job.request.prompt)) for job in heard]
    steps = sum(cached[job.key].steps for job in jobs)
    saved = sum(cached[job.key].cached for job in jobs)
    return {"median": float(np.median(values)), "min": float(min(values)), "match": sum(hits) / len(hits),
            "sound": (float(np.median(snrs)), float(min(snrs)), sum(pitched) / len(pitched)) if heard else None,
            "saved": saved / steps, "saved_steps": saved, "steps": steps}


def sound_columns(ours: Render, uncached: Render, scene: scenes.Scene) -> str:
    """The per-render table's sound cells: SNR against uncached and pitch match, ``–`` for a silent render."""
    if ours.sound is None:
        return "– | –"
    return f"{measure.snr(uncached.sound, ours.sound):.1f} | {'yes' if ours.sounds(scene) else 'NO'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", type=Path, default=REPO / "manifests" / "demo.yaml")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.1, 0.25, 0.4])
    parser.add_argument("--default", type=float, default=0.25, help="the threshold of the per-render table")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    thresholds = sorted(set(args.thresholds) | {args.default})

    demo = manifest.load(args.manifest)
    pipe = demo_pipeline(demo)
    start = time.perf_counter()
    uncached, cached = run(demo.jobs, pipe, thresholds)
    seconds = time.perf_counter() - start

    base_hits = [measure.matches(scenes.scene_of(j.request.prompt), measure.read(uncached[j.key].frames))
                 for j in demo.jobs]
    print(f"# step cache on the toy ({demo.model.checkpoint}): {len(demo.jobs)} demo jobs, commit {commit()}, "
          f"{platform.machine()} CPU, {args.threads} thread(s), {seconds:.0f} s")
    print(f"uncached prompt match: {sum(base_hits) / len(base_hits):.0%}\n")
    print(f"## per render, threshold {args.default} against uncached\n")
    print("| job | task | PSNR (dB) | steps cached | prompt match | sound SNR (dB) | sound names its colour |")
    print("|---|---|---|---|---|---|---|")
    default = cached[args.default]
    for job in demo.jobs:
        ours, scene = default[job.key], scenes.scene_of(job.request.prompt)
        hit = measure.matches(scene, measure.read(ours.frames))
        print(f"| {job.key} | {job.request.task} | {measure.psnr(ours.frames, uncached[job.key].frames):.1f} | "
              f"{ours.cached}/{ours.steps} | {'yes' if hit else 'NO'} | "
              f"{sound_columns(ours, uncached[job.key], scene)} |")
    for task in ("t2v", "t2i"):
        jobs = [job for job in demo.jobs if job.request.task == task]
        if not jobs:
            continue
        print(f"\n## threshold sweep, {task} ({len(jobs)} jobs)\n")
        print("| threshold | median PSNR (dB) | min PSNR (dB) | steps saved | prompt match "
              "| median sound SNR (dB) | min sound SNR (dB) | sound names its colour |")
        print("|---|---|---|---|---|---|---|---|")
        for th in thresholds:
            s = summary(jobs, uncached, cached[th])
            sound = "– | – | –" if s["sound"] is None else "{:.1f} | {:.1f} | {:.0%}".format(*s["sound"])
            print(f"| {th} | {s['median']:.1f} | {s['min']:.1f} | {s['saved_steps']}/{s['steps']} ({s['saved']:.0%}) "
                  f"| {s['match']:.0%} | {sound} |")


if __name__ == "__main__":
    main()
