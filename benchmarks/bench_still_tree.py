"""A still's steps (issue 15's T2I) in the tree it runs from (GPU): two warm-up stills (graphs captured in the
first), then N measured; prints each still's steps sum, the step kinds' medians and the memory, and saves the
last still's frames to /tmp/frames-LABEL.npy.

Two trees on one machine, each with its own kernel build, then their frames compared:

    python benchmarks/bench_render.py write --root /tmp/nano --variants fp8
    mkdir /tmp/old && git archive OLD cosmos3 benchmarks worker farm toy | tar -x -C /tmp/old
    cd /tmp/old && COSMOS3_BUILD_DIR=/tmp/b-old PYTHONPATH=/tmp/old \\
        python3 $REPO/benchmarks/bench_still_tree.py /tmp/nano old 4
    cd $REPO && COSMOS3_BUILD_DIR=/tmp/b-new python3 benchmarks/bench_still_tree.py /tmp/nano new 4
    python3 -c "import numpy as np; print((np.load('/tmp/frames-old.npy') == np.load('/tmp/frames-new.npy')).all())"

Arguments: the checkpoint root (``bench_render.py write``'s), a label, how many stills to measure. Only the
pipeline's public API is used, so an older tree runs it too.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the tree it runs from, not this file's


def main() -> None:
    root, label, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # a farm GPU worker's allocator, set before torch touches CUDA
    import numpy as np

    from benchmarks.bench_render import JOBS, PROMPT
    from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest

    pipe = Cosmos3Pipeline.from_pretrained(root / "fp8", device="cuda", attention="fp8")
    still = {k: v for k, v in JOBS["t2i"].items() if k not in ("id", "priority", "size")}
    request = RenderRequest(prompt=PROMPT, width=1024, height=1024, **still)
    warm = [sum(pipe(request).timings["steps"]) for _ in range(2)]
    sums = []
    for _ in range(count):
        out = pipe(request)
        sums.append(sum(out.timings["steps"]))
    steps, memory = out.timings["steps"], out.memory
    print(f"{label}: warm-up {', '.join(f'{s:.3f}' for s in warm)}; steps sums {', '.join(f'{s:.3f}' for s in sums)}; "
          f"median {statistics.median(sums):.3f} s; edge CFG step {statistics.median(steps[:3]) * 1e3:.1f} ms, "
          f"FP8 CFG step {statistics.median(steps[3:40]) * 1e3:.1f} ms; "
          f"peak {memory['peak_allocated_bytes'] / 2**30:.2f} GiB, resident {memory['resident_bytes'] / 2**30:.2f} GiB",
          flush=True)
    np.save(f"/tmp/frames-{label}.npy", out.frames)


if __name__ == "__main__":
    main()
