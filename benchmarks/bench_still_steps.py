"""A still's denoising steps with the host waiting for the GPU put back, against the pipeline as it is (GPU).

The GEN forwards of a graphed still are one graph replay each; what is left between them is host work (CFG,
UniPC's update, the next replay's inputs). Whenever the host waits for the GPU, the GPU then idles while that
work is launched. "waiting" puts back, in the same process, what the pipeline no longer does a step:

- step times by a device-synchronized clock (two drains a step) instead of CUDA events;
- UniPC's corrector solve with torch's host-side error check (a read of the device);
- every linear rebound to its step's precision on every step, not only where the policy's mode changes;
- every layer's UND K/V copied into the graph before every replay, not only when it holds another cache.

The rounds alternate, after two warm-up stills (the graphs captured in the first), on the issue's still
(1024x1024, 50 steps, guidance 7, interval (400, 1000)) of the Nano FP8 checkpoint ``bench_render.py write``
makes:

    python benchmarks/bench_render.py write --root /tmp/nano --variants fp8
    python benchmarks/bench_still_steps.py --root /tmp/nano --attention fp8
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosmos3.attention_choice import ATTENTION_CHOICES  # noqa: E402  (torch-free)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="bench_render.py write's --root")
    parser.add_argument("--attention", default="fp8", choices=ATTENTION_CHOICES)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # a farm GPU worker's allocator, set before torch touches CUDA
    import torch

    from benchmarks.bench_render import job_request, machine
    from cosmos3 import cuda_graphs, pipeline, sampling, step_precision, timing
    from cosmos3.pipeline import Cosmos3Pipeline

    class SyncedSteps(timing.StepTimes):
        """The old clock: wall-clock marks (the CPU branch of StepTimes), the GPU drained at each one."""

        def __init__(self, device):
            super().__init__(device)
            self.cuda = False

        def mark(self):
            torch.cuda.synchronize()
            super().mark()

    shipped = (pipeline.StepTimes, sampling._unchecked_solve, step_precision.StepPrecisionController.set_step,
               cuda_graphs.GenGraphs.run)

    def rebinding_set_step(self, step, num_steps):
        self._precise = None
        shipped[2](self, step, num_steps)

    def copying_run(self, *args):
        for captured in self._graphs.values():
            captured.holds = lambda: None
        return shipped[3](self, *args)

    def host_waits(waits: bool) -> None:
        waiting = (SyncedSteps, lambda: contextlib.nullcontext, rebinding_set_step, copying_run)
        (pipeline.StepTimes, sampling._unchecked_solve, step_precision.StepPrecisionController.set_step,
         cuda_graphs.GenGraphs.run) = waiting if waits else shipped

    pipe = Cosmos3Pipeline.from_pretrained(args.root / "fp8", device="cuda", attention=args.attention)
    request = job_request("t2i")

    def render() -> tuple[float, float]:
        started = time.perf_counter()
        out = pipe(request)
        return sum(out.timings["steps"]), time.perf_counter() - started

    print(f"GPU {machine()}; attention {args.attention}; warm-up stills (graphs captured in the first): "
          + ", ".join(f"{render()[0]:.3f} s" for _ in range(2)), flush=True)
    rows = {True: [], False: []}
    for _ in range(args.rounds):
        for waits in (True, False):
            host_waits(waits)
            rows[waits].append(render())
    host_waits(False)
    print("| host | steps sum s, per round | median | job wall s, median | vs now |")
    print("|---|---|---|---|---|")
    now = statistics.median(s for s, _ in rows[False])
    for waits, label in ((True, "waiting (as before)"), (False, "now")):
        sums = [s for s, _ in rows[waits]]
        walls = [w for _, w in rows[waits]]
        print(f"| {label} | {', '.join(f'{s:.3f}' for s in sums)} | {statistics.median(sums):.3f} | "
              f"{statistics.median(walls):.3f} | {statistics.median(sums) / now:.3f}x |")


if __name__ == "__main__":
    main()
