"""What several benchmarks share: the machine line, CUDA-event timing, the Nano workload's jobs, the page cache.

Torch is imported inside the functions that need it, so a CPU benchmark (and ``bench_render.py report``) imports
this module without it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

GIB = 1 << 30

# The Nano workload: T2V 1280x720 189 frames 35 steps guidance 6; T2I 1024x1024 50 steps guidance 7 (its
# (400, 1000) guidance interval is the T2I default); I2V 1280x720 189 frames. t2i-seed2 and t2i-seed3 are the same
# still with other seeds, right after it, as in a studio's batch of variations: their GEN passes replay the bucket's
# graphs the first captured (a prompt length gets its own only once it ran in each of the last 8 jobs), and their
# prompt's UND pass, run a job ago, is captured by the second and replayed by the third (cosmos3/cuda_graphs.py).
PROMPT = "a slow drone flight between harbour skyscrapers at dusk, city lights switching on, calm water"
JOBS = {
    "t2i": {"id": "t2i", "task": "t2i", "size": [1024, 1024], "steps": 50, "guidance": 7.0, "priority": 10},
    "t2i-seed2": {"id": "t2i-seed2", "task": "t2i", "size": [1024, 1024], "steps": 50, "guidance": 7.0, "seed": 2,
                  "priority": 9},
    "t2i-seed3": {"id": "t2i-seed3", "task": "t2i", "size": [1024, 1024], "steps": 50, "guidance": 7.0, "seed": 3,
                  "priority": 8},
    "t2v": {"id": "t2v", "task": "t2v", "size": [1280, 720], "frames": 189, "steps": 35, "guidance": 6.0,
            "priority": 5},
    # The clip again with another seed: two clips back to back, the second rendered while the first publishes.
    "t2v-seed2": {"id": "t2v-seed2", "task": "t2v", "size": [1280, 720], "frames": 189, "steps": 35, "guidance": 6.0,
                  "seed": 2, "priority": 5},
    "i2v": {"id": "i2v", "task": "i2v", "image": "inputs/frame.png", "size": [1280, 720], "frames": 189,
            "steps": 35, "guidance": 6.0},
    # A short clip for the forced re-renders (33 frames, 10 steps: ~1/5 of the clip's tokens, a third of its steps).
    "t2v-short": {"id": "t2v-short", "task": "t2v", "size": [1280, 720], "frames": 33, "steps": 10, "guidance": 6.0,
                  "priority": 4},
    # A clip on the clip's own path at a quarter of its cost, for the forced re-renders: 22,080 tokens a pass (eager
    # passes, FP8 attention past 16,384), the step policy's edge steps, the step cache, the chunked decode, the MP4.
    "t2v-half": {"id": "t2v-half", "task": "t2v", "size": [1280, 720], "frames": 93, "steps": 20, "guidance": 6.0,
                 "priority": 4},
    # The distilled builds' jobs: their steps and guidance are the checkpoint's (a manifest naming them is refused).
    "t2i-4step": {"id": "t2i-4step", "task": "t2i", "size": [1024, 1024], "priority": 10},
    "i2v-4step": {"id": "i2v-4step", "task": "i2v", "image": "inputs/frame.png", "size": [1280, 720], "frames": 189},
}
# The builds benchmarks/random_checkpoint.py writes (its BUILDS), named here for parsers that import no torch.
BUILD_NAMES = ("nano", "super", "super-i2v", "super-t2i", "super-t2i-4step", "super-i2v-4step")
WEIGHT_SETS = 8  # more than the 50 MB L2 holds, as 36 layers' weights
CALLS = 36  # one forward's layers


def job_request(name: str):
    """One of the workload's jobs (``JOBS[name]``, with ``PROMPT``) as the pipeline's request."""
    from cosmos3.pipeline import RenderRequest

    job = {k: v for k, v in JOBS[name].items() if k not in ("id", "priority", "size")}
    width, height = JOBS[name]["size"]
    return RenderRequest(prompt=PROMPT, width=width, height=height, **job)


def machine() -> str:
    """The GPU (name, SM version, SMs, memory), CUDA and torch; the CPU and torch without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"
    props = torch.cuda.get_device_properties(0)
    return (f"{props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
            f"{props.total_memory / GIB:.0f} GiB, CUDA {torch.version.cuda}, torch {torch.__version__}")


def timed(fn, iters: int, warmup: int) -> float:
    """Median milliseconds (CUDA events) of ``fn`` over ``iters`` runs after ``warmup`` runs."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graphed_us(fn, rounds_of: list):
    """Captures CALLS calls of ``fn(i)`` in one graph; returns a function that appends a replay's microseconds a
    call to ``rounds_of``."""
    import torch

    for i in range(3):
        fn(i)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(i)

    def time_once() -> None:
        graph.replay()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        rounds_of.append(begin.elapsed_time(end) * 1e3 / CALLS)

    return time_once


def add_still_command(sub, *, stills: int, **child) -> None:
    """The ``still`` subcommand of a benchmark that renders the workload's still in alternating child processes;
    the parent starts each child with ``--child`` (``child``: that argument's ``choices`` or ``nargs``)."""
    from cosmos3.rules.attention_choice import ATTENTION_CHOICES  # torch-free

    still_parser = sub.add_parser("still")
    still_parser.add_argument("--root", type=Path, required=True, help="bench_render.py write's --root")
    still_parser.add_argument("--attention", default="fp8", choices=ATTENTION_CHOICES)
    still_parser.add_argument("--rounds", type=int, default=2)
    still_parser.add_argument("--stills", type=int, default=stills)
    still_parser.add_argument("--child", help=argparse.SUPPRESS, **child)


def drop_page_cache() -> str:
    """So a reader reads the checkpoint from the disk, not from memory the writer just filled (needs root)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except OSError as err:
        return f"not dropped ({err})"


def stream_order(prompts: int, passes: int, order: str) -> list[int]:
    """Prompt indices: ``passes`` passes over ``prompts`` prompts, each pass shuffled on its own (seeded), or each
    prompt ``passes`` times in a row (``order="batches"``)."""
    import random

    if order == "batches":
        return [i for i in range(prompts) for _ in range(passes)]
    rng = random.Random(0)
    indices = []
    for _ in range(passes):
        one = list(range(prompts))
        rng.shuffle(one)
        indices += one
    return indices
