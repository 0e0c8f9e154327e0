"""A farm's stream of stills whose prompt lengths come back (GPU): how long a still's steps take under the GEN graph
rule of the tree (a prompt length gets graphs of its exact length once it ran in each of the last
``RECURRING_JOBS`` jobs) against session 22's (once any of the last 4 jobs ran it), and the tree's bucket graph per
CFG branch against session 24's one for both (which copies the other branch's K/V in before each pass), side by
side in one process on one loaded pipeline.

Two orders of the same stills:
- ``shuffled``: ``--prompts`` prompts of distinct lengths in ``--passes`` passes, each pass shuffled (seeded), so
  a length comes back after about ``--prompts`` other stills;
- ``batches``: each prompt ``--passes`` times in a row (a studio's batch of seeds), prompt after prompt.

Exact-length graphs save ~0.007 s a still (FA3's row-skipping kernel is its slower varlen build), and capturing
them costs ~0.06 s a graph, two a branch; which rule wins depends on how often a length comes back.

    python benchmarks/bench_render.py write --root /tmp/nano --variants fp8
    python benchmarks/bench_still_stream.py /tmp/nano --prompts 8 --passes 3 --rounds 1 --orders shuffled batches

Each round runs every order under each rule (the rules alternating), each stream from fresh graphs after one
warm-up still of another prompt (the shape's buckets, the held W8A16 weights). Prints each still's steps sum and
the GPU memory reserved after it (a worker that renders for days must not grow), then a table: the mean and median
over each stream's stills, captures included, and how many stills captured GEN graphs. Prompts past the eighth run
over 128 tokens, into the next bucket.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from benchmarks.bench_still_prompts import new_prompt, still_renderer  # noqa: E402


def stream_order(prompts: int, passes: int, order: str) -> list[int]:
    """Prompt indices: ``passes`` passes over ``prompts`` prompts, each pass shuffled on its own (seeded), or each
    prompt ``passes`` times in a row."""
    if order == "batches":
        return [i for i in range(prompts) for _ in range(passes)]
    rng = random.Random(0)
    indices = []
    for _ in range(passes):
        one = list(range(prompts))
        rng.shuffle(one)
        indices += one
    return indices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--orders", nargs="+", choices=("shuffled", "batches"), default=["shuffled", "batches"])
    args = parser.parse_args()

    import torch

    from benchmarks.bench_render import PROMPT
    from cosmos3.cuda_graphs import GRAPH_MAX_TOKENS, RECURRING_JOBS, enable_cuda_graphs

    rules = {  # name -> enable_cuda_graphs's rule
        f"in each of the last {RECURRING_JOBS} jobs (this tree)": {},
        "in any of the last 4 jobs (session 22)": {"recurring_jobs": 1, "recent_jobs": 4},
        "this tree, one bucket graph for both CFG branches (session 24)": {"bucket_slots": 1},
    }
    pipe, render = still_renderer(args.root)
    prompts = [new_prompt(n) for n in range(1, args.prompts + 1)]
    lengths = [len(pipe.tokenizer.encode(p, "image")) for p in prompts]  # before the metadata sentence
    print(f"GPU {torch.cuda.get_device_name()}; {args.prompts} prompts of {lengths} tokens (plus the resolution "
          f"sentence), {args.passes} stills each; orders {args.orders}", flush=True)
    steps_of = {(order, rule): [] for order in args.orders for rule in rules}
    captured_of = {key: 0 for key in steps_of}  # stills that captured GEN graphs
    reserved_of = {key: [] for key in steps_of}  # GiB after each stream: a long worker's memory
    for round_ in range(args.rounds):
        for order in args.orders:
            indices = stream_order(args.prompts, args.passes, order)
            for rule in (list(rules) if round_ % 2 == 0 else list(reversed(rules))):
                pipe.model.cuda_graphs.prepare(GRAPH_MAX_TOKENS + 1)  # frees the held W8A16 weights and UND graphs
                enable_cuda_graphs(pipe.model, **rules[rule])
                torch.cuda.empty_cache()
                render(PROMPT)
                steps, gib = [], []
                for i in indices:
                    steps.append(render(prompts[i])[0])
                    captured_of[order, rule] += pipe.model.cuda_graphs.job.gen_captured > 0
                    gib.append(torch.cuda.memory_reserved() / 2**30)
                steps_of[order, rule] += steps
                reserved_of[order, rule].append(gib[-1])
                print(f"round {round_ + 1}, {order}, {rule}: steps s " + ", ".join(f"{s:.3f}" for s in steps),
                      flush=True)
                print(f"round {round_ + 1}, {order}, {rule}: GiB reserved after each still "
                      + ", ".join(f"{g:.2f}" for g in gib), flush=True)
    print("| order | graph rule | stills | mean steps s | median steps s | stills that captured | mean vs this tree "
          "| GiB reserved at the end |")
    print("|---|---|---|---|---|---|---|---|")
    for order in args.orders:
        base = statistics.fmean(steps_of[order, next(iter(rules))])
        for rule in rules:
            steps = steps_of[order, rule]
            mean = statistics.fmean(steps)
            print(f"| {order} | {rule} | {len(steps)} | {mean:.4f} | {statistics.median(steps):.4f} "
                  f"| {captured_of[order, rule]} | {mean / base:.3f}x "
                  f"| {', '.join(f'{g:.2f}' for g in reserved_of[order, rule])} |")


if __name__ == "__main__":
    main()
