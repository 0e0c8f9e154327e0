"""What a cached step costs on the GPU, and what a schedule of cached steps gives a Nano-shaped FP8 clip and still.

Random weights make SeaCache's own decisions meaningless (the indicator of random latents moves as it likes), so
each arm runs a *fixed* schedule through the pipeline's step cache: the indicator, its host read and the residual
bookkeeping run every step as in a real render; only the decision is given. Side by side in one process:

* the clip (bench_render's T2V: 1280x720, 189 frames, 35 steps, CFG 6) uncached and with 16 of its 35 steps cached
  (what SeaCache's 1.82x on Nano implies), never a W8A16 edge step, at most two in a row;
* the still (1024x1024, 50 steps) uncached and with 20 of 50 cached, each twice (the first captures its graphs);
* what the checkpoint's W8A16 edge steps cost a cached clip: the same 16 cached steps with every computed step
  W8A8 (the step policy's windows emptied for the arm, as ``step_precision: off`` renders; named in ``--arms``).

Per arm: the denoising seconds, the mean computed (W8A8) and cached step, the job's peak memory during the steps.

    python -m benchmarks.bench_cached_steps write --root /tmp/nano        # the random FP8 checkpoint
    python -m benchmarks.bench_cached_steps run --root /tmp/nano --out $OUT/cached-steps.json
    python -m benchmarks.bench_cached_steps run --root /tmp/nano --attention fp8 --arms clip-cached clip-cached-w8a8 \
        --out $OUT/cached-steps-edges.json
    python -m benchmarks.bench_cached_steps report $OUT/cached-steps.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import NamedTuple

from benchmarks.common import GIB, PROMPT, job_request, machine

CLIP_CACHED, STILL_CACHED = 16, 20


def fixed_schedule(num_steps: int, edges: set[int], cached: int) -> set[int]:
    """``cached`` steps to cache among the non-edge ones, each run of two following a computed step."""
    chosen: set[int] = set()
    middle = [i for i in range(num_steps) if i not in edges]
    for position, step in enumerate(middle[1:], start=1):  # the first middle step computes: residuals to reuse
        if len(chosen) < cached and position % 3 != 0:
            chosen.add(step)
    if len(chosen) != cached:
        raise ValueError(f"{num_steps} steps with edges {sorted(edges)} cannot cache {cached} two in a row")
    return chosen


def use_schedule(pipe, cached: int | None, policy) -> None:
    """Make ``pipe`` run ``cached`` of every job's steps cached on a fixed schedule (None: uncached), never one of
    ``policy``'s W8A16 edge steps (a ``StepPolicy``: the checkpoint's)."""
    from cosmos3.rules.cache_options import SeaCacheSettings
    from cosmos3.step_cache import StepCache

    class FixedSchedule(StepCache):
        def __init__(self, chosen: set[int], *args):
            super().__init__(*args)
            self.chosen = chosen

        def decide(self, step, latents, branches):
            super().decide(step, latents, branches)  # the indicator and its host read, as a real gate runs them
            compute = step not in self.chosen
            self.computed[-1] = compute
            return compute

    def step_cache(plan, scheduler):
        if cached is None:
            return None
        n = len(scheduler.timesteps)
        edges = set(policy.a16_steps(n))
        sigmas = [float(s) for s in scheduler.sigmas[:n].tolist()]
        return FixedSchedule(fixed_schedule(n, edges, cached), SeaCacheSettings(), sigmas, frozenset(edges))

    pipe._step_cache = step_cache


class Arm(NamedTuple):
    key: str  # --arms
    name: str
    job: str
    cached: int | None  # steps cached on the fixed schedule; None: uncached
    edge_steps: bool = True  # False: the step policy's W8A16 steps run W8A8 too


ARMS = [Arm("still", "still uncached", "t2i", None), Arm("still-again", "still uncached again", "t2i", None),
        Arm("still-cached", f"still {STILL_CACHED}/50 cached", "t2i", STILL_CACHED),
        Arm("still-cached-again", f"still {STILL_CACHED}/50 cached again", "t2i", STILL_CACHED),
        Arm("clip-cached", f"clip {CLIP_CACHED}/35 cached", "t2v", CLIP_CACHED),
        Arm("clip", "clip uncached", "t2v", None),
        Arm("clip-cached-w8a8", f"clip {CLIP_CACHED}/35 cached, edge steps W8A8", "t2v", CLIP_CACHED, False)]


def arm(pipe, spec: Arm, published) -> dict:
    """One arm's job; ``published``: the checkpoint's step policy (the schedule's edges, and the arm's policy unless
    it runs its edge steps W8A8)."""
    import torch

    from cosmos3.rules.step_precision import StepPolicy

    name, job, cached = spec.name, spec.job, spec.cached
    no_windows = StepPolicy(0, 0, published.reasoner, source="override")
    pipe.model.step_controller.policy = published if spec.edge_steps else no_windows
    use_schedule(pipe, cached, published)
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = pipe(job_request(job))
    wall = time.perf_counter() - started
    steps = out.timings["steps"]
    info = out.info["cache"]
    cached_steps = set() if info is None else set(info["cached"])
    edges = set(out.info["step_policy"]["a16_steps"]) if out.info["step_policy"] else set()
    full = [t for i, t in enumerate(steps) if i not in cached_steps and i not in edges and i > 0]
    result = {
        "arm": name, "job": job, "wall": wall, "timings": out.timings, "memory": out.memory, "cache": info,
        "cuda_graphs": out.info["cuda_graphs"],
        "steps_s": sum(steps), "full_step_s": statistics.mean(full),
        "cached_step_s": statistics.mean([steps[i] for i in sorted(cached_steps)]) if cached_steps else None,
    }
    print(f"{name}: steps {result['steps_s']:.2f} s, full step {result['full_step_s']:.4f} s, cached step "
          f"{result['cached_step_s']}, peak during steps "
          f"{out.memory['stage_peak_allocated_bytes']['steps'] / GIB:.2f} GiB", flush=True)
    return result


def do_write(args) -> None:
    from benchmarks.random_checkpoint import write_checkpoint

    stats = write_checkpoint(args.root / "fp8", variant="fp8", device="cuda",
                             words=tuple(PROMPT.replace(",", " ").split()))
    print(f"fp8: {stats.bytes / 1e9:.2f} GB in {stats.seconds:.1f} s", flush=True)


def do_run(args) -> None:
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # a farm worker's allocator settings, before torch touches CUDA
    from cosmos3.pipeline import Cosmos3Pipeline

    pipe = Cosmos3Pipeline.from_pretrained(args.root / "fp8", device="cuda", vae_load="background",
                                           attention=args.attention)
    results = {"machine": machine(), "attention": args.attention, "load": pipe.load_timings, "arms": []}
    published = pipe.model.step_controller.policy
    for spec in [a for a in ARMS if a.job in args.jobs and a.key in args.arms]:
        results["arms"].append(arm(pipe, spec, published))
        args.out.write_text(json.dumps(results, indent=1, default=str))  # what ran comes back if the call ends


def do_report(args) -> None:
    results = json.loads(args.out.read_text())
    arms = {a["arm"]: a for a in results["arms"]}
    print(f"{results['machine']}\nattention: {results.get('attention', 'auto')}\n")
    print("| arm | steps s | computed W8A8 step s | cached step s | cached / computed | peak in steps GiB | "
          "decode s | total s |")
    print("|---|---|---|---|---|---|---|---|")
    for a in arms.values():
        ratio = "" if a["cached_step_s"] is None else f"{a['cached_step_s'] / a['full_step_s']:.2%}"
        cached = "" if a["cached_step_s"] is None else f"{a['cached_step_s']:.4f}"
        peak = a["memory"]["stage_peak_allocated_bytes"]["steps"] / GIB
        print(f"| {a['arm']} | {a['steps_s']:.2f} | {a['full_step_s']:.4f} | {cached} | {ratio} | {peak:.2f} | "
              f"{a['timings']['vae_decode']:.2f} | {a['timings']['total']:.2f} |")
    pairs = [("clip uncached", f"clip {CLIP_CACHED}/35 cached"),
             (f"clip {CLIP_CACHED}/35 cached", f"clip {CLIP_CACHED}/35 cached, edge steps W8A8"),
             ("still uncached again", f"still {STILL_CACHED}/50 cached again")]
    for base, cached in pairs:
        if base in arms and cached in arms:
            print(f"\n{cached} vs {base}: steps {arms[base]['steps_s'] / arms[cached]['steps_s']:.3f}x faster, "
                  f"job {arms[base]['timings']['total'] / arms[cached]['timings']['total']:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write")
    write.add_argument("--root", type=Path, required=True)
    run = sub.add_parser("run")
    run.add_argument("--root", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--attention", default="auto", choices=["auto", "bf16", "fp8"])
    run.add_argument("--jobs", nargs="+", default=["t2i", "t2v"], choices=["t2i", "t2v"], help="which jobs' arms")
    keys = [a.key for a in ARMS]
    run.add_argument("--arms", nargs="+", default=[k for k in keys if k != "clip-cached-w8a8"], choices=keys,
                     help="which arms to run, in the order above (clip-cached-w8a8 only when named)")
    report = sub.add_parser("report")
    report.add_argument("out", type=Path)
    args = parser.parse_args()
    {"write": do_write, "run": do_run, "report": do_report}[args.command](args)


if __name__ == "__main__":
    main()
