"""A still's UND pass (both CFG branches) eager against replayed from its CUDA graphs, one model (GPU; issue 15).

The UND tower runs once per CFG branch of a job. At a prompt's ~50 tokens its ~1,700 kernels are bound by their
launches, not their maths. This loads the FP8 Nano checkpoint that ``bench_render.py write`` makes, tokenizes
issue 15's T2I request (cond and uncond prompts), and then alternates rounds on the same weights:

* eager: ``model.und`` (what ``encode_text`` runs without graphs);
* graphed: ``model.encode_text``, which replays each length's graph (the warm-up runs each length twice: the
  second pass captures).

It prints each round's wall seconds (the host, until both caches are on the GPU), the medians and their ratio,
and whether the two give the same K/V bit for bit.

    python benchmarks/bench_render.py write --root /tmp/nano --variants fp8
    python benchmarks/bench_und.py --root /tmp/nano [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_render import job_request  # noqa: E402
from cosmos3.pipeline import Cosmos3Pipeline  # noqa: E402
from cosmos3.request import resolve  # noqa: E402


def timed(und, ids) -> tuple[float, list]:
    """Wall seconds of ``und`` over every branch's ids, and the caches."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    caches = [und(branch) for branch in ids]
    torch.cuda.synchronize()
    return time.perf_counter() - start, caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="bench_render.py write's --root")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    pipe = Cosmos3Pipeline.from_pretrained(args.root / "fp8", device="cuda", vae_load="background")
    model = pipe.model
    ids = pipe._token_ids(resolve(job_request("t2i"), pipe.rules))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}; Nano FP8, UND {len(model.layers)} layers, "
          f"token ids {' and '.join(str(branch.numel()) for branch in ids)} (cond, uncond)")

    forms = {"eager": model.und, "graphed": model.encode_text}
    for und in (model.und, model.encode_text, model.encode_text):  # warm-up; the second graphed pass captures
        timed(und, ids)
    seconds = {name: [] for name in forms}
    caches = {}
    for _ in range(args.rounds):
        for name, und in forms.items():
            took, caches[name] = timed(und, ids)
            seconds[name].append(took)
    same = all(torch.equal(a, b) for x, y in zip(caches["eager"], caches["graphed"], strict=True)
               for a, b in zip([*x.keys, *x.values], [*y.keys, *y.values], strict=True))
    print("| UND pass, both branches | seconds per round | median s | vs graphed |")
    print("|---|---|---|---|")
    base = statistics.median(seconds["graphed"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {', '.join(f'{v:.4f}' for v in values)} | {median:.4f} | {median / base:.2f}x |")
    print(f"K/V bit for bit equal: {same}")


if __name__ == "__main__":
    main()
