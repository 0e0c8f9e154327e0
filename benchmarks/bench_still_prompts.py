"""Stills of prompts the worker has not seen (GPU): issue 15's T2I with a new prompt length each, against the
same prompt's next still, in the tree it runs from. A farm renders thousands of stills a day, most of them of a
prompt length it has never run; before a graph served every length of its bucket (cosmos3/cuda_graphs.py), each
such still captured its GEN graphs (two extra forwards a graph).

Two trees on one machine, side by side (as bench_still_tree.py):

    python benchmarks/bench_render.py write --root /tmp/nano --variants fp8
    mkdir /tmp/old && git archive OLD cosmos3 benchmarks worker farm toy | tar -x -C /tmp/old
    cd /tmp/old && PYTHONPATH=/tmp/old python3 $REPO/benchmarks/bench_still_prompts.py /tmp/nano old 6
    cd $REPO && python3 benchmarks/bench_still_prompts.py /tmp/nano new 6

Arguments: the checkpoint root, a label, how many new prompts. Each new prompt is the benchmark's prompt with
more words; it runs three times (its first still, then the same prompt twice: under session 22's rule its second
still captured graphs of its exact length; now a length gets them only once it ran in each of the last 8 jobs).
Prints each still's steps sum and UND time, and the medians. Only the pipeline's public API is used, so an older
tree runs it too.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the tree it runs from, not this file's

WORDS = "with glass towers reflecting an orange sky while ferries cross the bay".split()


def new_prompt(n: int) -> str:
    """The benchmark's prompt with ``n * n`` more words: a new length for every ``n``."""
    from benchmarks.bench_render import PROMPT

    return f"{PROMPT}, {' '.join(WORDS[:n] * n)}"


def still_renderer(root: Path):
    """Issue 15's still on the Nano FP8 checkpoint under ``root``, as a farm GPU worker loads it: returns the
    pipeline and ``render(prompt) -> (steps sum s, UND s)``."""
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # a farm GPU worker's allocator, set before torch touches CUDA

    from benchmarks.bench_render import JOBS
    from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest

    pipe = Cosmos3Pipeline.from_pretrained(root / "fp8", device="cuda", attention="fp8")
    still = {k: v for k, v in JOBS["t2i"].items() if k not in ("id", "priority", "size")}

    def render(prompt: str) -> tuple[float, float]:
        timings = pipe(RenderRequest(prompt=prompt, width=1024, height=1024, **still)).timings
        return sum(timings["steps"]), timings["und"]

    return pipe, render


def main() -> None:
    root, label, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    from benchmarks.bench_render import PROMPT

    _, render = still_renderer(root)
    warm = [render(PROMPT)[0] for _ in range(2)]  # the shape's first still captures; the second replays
    print(f"{label}: warm-up (the benchmark's prompt) steps {warm[0]:.3f}, {warm[1]:.3f} s", flush=True)
    stills = []  # per prompt: (steps, UND) of its first, second and third still
    for n in range(1, count + 1):
        prompt = new_prompt(n)
        stills.append([render(prompt) for _ in range(3)])
        print(f"{label}: prompt +{n * n} words: steps (UND) of its stills "
              + ", ".join(f"{steps:.3f} ({und:.3f})" for steps, und in stills[-1]), flush=True)
    first, second, third = (statistics.median(runs[i][0] for runs in stills) for i in range(3))
    print(f"{label}: median steps of a prompt's first still {first:.3f} s, second {second:.3f} s, third {third:.3f} s; "
          f"first / third {first / third:.3f}x")


if __name__ == "__main__":
    main()
