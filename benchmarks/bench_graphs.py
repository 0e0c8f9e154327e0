"""A still's CUDA graphs on the Nano FP8 checkpoint (GPU), side by side in one process on one loaded pipeline.

``stream``: a farm's stream of stills whose prompt lengths come back: a still's steps under the default GEN graph
rule (a prompt length gets graphs of its exact length once it ran in each of the last ``RECURRING_JOBS`` jobs)
against exact-length graphs once any of the last 4 jobs ran it, and the default's bucket graph per CFG branch
against one for both (which copies the other branch's K/V in before each pass). Two orders of the same stills:
``shuffled`` (``--prompts`` prompts of distinct lengths in ``--passes`` passes, each pass shuffled, so a length
comes back after about ``--prompts`` other stills) and ``batches`` (each prompt ``--passes`` times in a row, a
studio's batch of seeds). Exact-length graphs save ~0.007 s a still (FA3's row-skipping kernel is its slower
varlen build), and capturing them costs ~0.06 s a graph, two a branch; which rule wins depends on how often a
length comes back. Each round runs every order under each rule (the rules alternating), each stream from fresh
graphs after one warm-up still of another prompt. Prints each still's steps sum and the GPU memory reserved after
it (a worker that renders for days must not grow), then the mean and median over each stream's stills, captures
included, and how many stills captured GEN graphs. Prompts past the eighth run over 128 tokens, into the next bucket.

``und``: the still's UND pass (both CFG branches) eager (``model.und``) against replayed from its graphs
(``model.encode_text``; the warm-up runs each length twice, the second pass captures), rounds alternating: each
round's wall seconds until both caches are on the GPU, the medians, their ratio, and whether the K/V are equal bit
for bit. At a prompt's ~50 tokens the tower's ~1,700 kernels are bound by their launches, not their maths.

    python -m benchmarks.bench_render write --root /tmp/nano --variants fp8
    python -m benchmarks.bench_graphs stream --root /tmp/nano --prompts 8 --passes 3 --orders shuffled batches
    python -m benchmarks.bench_graphs und --root /tmp/nano [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.common import JOBS, PROMPT, job_request, stream_order

WORDS = "with glass towers reflecting an orange sky while ferries cross the bay".split()


def new_prompt(n: int) -> str:
    """The workload's prompt with ``n * n`` more words: a new length for every ``n``."""
    return f"{PROMPT}, {' '.join(WORDS[:n] * n)}"


def still_renderer(root: Path):
    """The workload's still on the Nano FP8 checkpoint under ``root``, as a farm GPU worker loads it: returns the
    pipeline and ``render(prompt) -> (steps sum s, UND s)``."""
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # a farm GPU worker's allocator, set before torch touches CUDA

    from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest

    pipe = Cosmos3Pipeline.from_pretrained(root / "fp8", device="cuda", attention="fp8")
    still = {k: v for k, v in JOBS["t2i"].items() if k not in ("id", "priority", "size")}

    def render(prompt: str) -> tuple[float, float]:
        timings = pipe(RenderRequest(prompt=prompt, width=1024, height=1024, **still)).timings
        return sum(timings["steps"]), timings["und"]

    return pipe, render


def stream(args) -> None:
    import torch

    from cosmos3.cuda_graphs import GRAPH_MAX_TOKENS, RECURRING_JOBS, enable_cuda_graphs

    rules = {  # name -> enable_cuda_graphs's rule
        f"exact length once in each of the last {RECURRING_JOBS} jobs (the default)": {},
        "exact length once in any of the last 4 jobs": {"recurring_jobs": 1, "recent_jobs": 4},
        "the default, one bucket graph for both CFG branches": {"bucket_slots": 1},
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
    print("| order | graph rule | stills | mean steps s | median steps s | stills that captured | mean vs the default "
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


def und_seconds(und, ids) -> tuple[float, list]:
    """Wall seconds of ``und`` over every branch's ids, and the caches."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    caches = [und(branch) for branch in ids]
    torch.cuda.synchronize()
    return time.perf_counter() - start, caches


def und(args) -> None:
    import torch

    from cosmos3.pipeline import Cosmos3Pipeline
    from cosmos3.rules.request import resolve

    pipe = Cosmos3Pipeline.from_pretrained(args.root / "fp8", device="cuda", vae_load="background")
    model = pipe.model
    ids = pipe._token_ids(resolve(job_request("t2i"), pipe.rules))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}; Nano FP8, UND {len(model.layers)} layers, "
          f"token ids {' and '.join(str(branch.numel()) for branch in ids)} (cond, uncond)")

    forms = {"eager": model.und, "graphed": model.encode_text}
    for und in (model.und, model.encode_text, model.encode_text):  # warm-up; the second graphed pass captures
        und_seconds(und, ids)
    seconds = {name: [] for name in forms}
    caches = {}
    for _ in range(args.rounds):
        for name, und in forms.items():
            took, caches[name] = und_seconds(und, ids)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    stream_parser = sub.add_parser("stream")
    stream_parser.add_argument("--root", type=Path, required=True, help="bench_render.py write's --root")
    stream_parser.add_argument("--prompts", type=int, default=8)
    stream_parser.add_argument("--passes", type=int, default=3)
    stream_parser.add_argument("--rounds", type=int, default=1)
    stream_parser.add_argument("--orders", nargs="+", choices=("shuffled", "batches"),
                               default=["shuffled", "batches"])
    und_parser = sub.add_parser("und")
    und_parser.add_argument("--root", type=Path, required=True, help="bench_render.py write's --root")
    und_parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    {"stream": stream, "und": und}[args.command](args)


if __name__ == "__main__":
    main()
