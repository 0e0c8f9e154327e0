"""A farm's stream of stills whose prompt lengths come back now and then (GPU): how long a still's steps take when
prompt lengths recur, under the GEN/UND graph rule of the tree (exact-length graphs only for lengths one of the
last ``RECENT_JOBS`` jobs ran) against the rule before (for any length an earlier job ran), side by side in one
process on one loaded pipeline.

A farm renders thousands of stills a day with a few hundred prompt lengths among them: before long every length
has run once, and under the old rule each still of a length seen long ago captured exact graphs (two extra
forwards a graph) that the least-recently-used limit dropped again before that length came back.

    python benchmarks/bench_render.py write --root /tmp/nano --variants fp8
    python benchmarks/bench_still_stream.py /tmp/nano --prompts 8 --passes 3 --rounds 2

The stream: ``--prompts`` prompts of distinct lengths, in ``--passes`` passes, each pass in its own shuffled
order (seeded), so a length comes back after about ``--prompts`` other stills. Each round runs the stream once
under each rule (the order alternating), each from fresh graphs after one warm-up still of another prompt. Prints
each still's steps sum and the GPU memory reserved after it (a worker that renders for days must not grow), and the
medians of the passes after the first (every length there has run before). Prompts past the eighth run over 128
tokens, into the next bucket.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from benchmarks.bench_still_prompts import new_prompt, still_renderer  # noqa: E402


def stream_order(prompts: int, passes: int) -> list[int]:
    """Prompt indices: ``passes`` passes over ``prompts`` prompts, each pass shuffled on its own (seeded)."""
    rng = random.Random(0)
    order = []
    for _ in range(passes):
        one = list(range(prompts))
        rng.shuffle(one)
        order += one
    return order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import torch

    from benchmarks.bench_render import PROMPT
    from cosmos3.cuda_graphs import GRAPH_MAX_TOKENS, RECENT_JOBS, enable_cuda_graphs

    rules = {"recent jobs (this tree)": RECENT_JOBS, "any earlier job (before)": 10**9}  # name -> recent_jobs
    pipe, render = still_renderer(args.root)
    prompts = [new_prompt(n) for n in range(1, args.prompts + 1)]
    order = stream_order(args.prompts, args.passes)
    lengths = [len(pipe.tokenizer.encode(p, "image")) for p in prompts]  # before the metadata sentence
    print(f"GPU {torch.cuda.get_device_name()}; {len(order)} stills over {args.prompts} prompts of {lengths} tokens "
          f"(plus the resolution sentence), in the order {order}; RECENT_JOBS {RECENT_JOBS}", flush=True)
    later: dict[str, list[float]] = {rule: [] for rule in rules}
    reserved: dict[str, list[float]] = {rule: [] for rule in rules}  # GiB after each stream: a long worker's memory
    for round_ in range(args.rounds):
        for rule in (list(rules) if round_ % 2 == 0 else list(reversed(rules))):
            pipe.model.cuda_graphs.prepare(GRAPH_MAX_TOKENS + 1)  # frees the held W8A16 weights and UND graphs
            enable_cuda_graphs(pipe.model, recent_jobs=rules[rule])
            torch.cuda.empty_cache()
            render(PROMPT)  # the shape's buckets, the negative prompt's graphs, the held W8A16 weights
            steps, gib = [], []
            for i in order:
                steps.append(render(prompts[i])[0])
                gib.append(torch.cuda.memory_reserved() / 2**30)
            later[rule] += steps[args.prompts:]
            reserved[rule].append(gib[-1])
            print(f"round {round_ + 1}, {rule}: steps s " + ", ".join(f"{s:.3f}" for s in steps), flush=True)
            print(f"round {round_ + 1}, {rule}: GiB reserved after each still " + ", ".join(f"{g:.2f}" for g in gib),
                  flush=True)
    base = statistics.median(later[next(iter(rules))])
    print("| graph rule | stills after the first pass | median steps s | mean steps s | vs this tree "
          "| GiB reserved at the end |")
    print("|---|---|---|---|---|---|")
    for rule, steps in later.items():
        median = statistics.median(steps)
        print(f"| {rule} | {len(steps)} | {median:.4f} | {statistics.fmean(steps):.4f} | {median / base:.3f}x "
              f"| {', '.join(f'{g:.2f}' for g in reserved[rule])} |")


if __name__ == "__main__":
    main()
