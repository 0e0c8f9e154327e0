"""The planned GPU memory (cosmos3.rules.memory_plan) beside the measured peak, per job, on Nano and Super shapes.

    python -m benchmarks.bench_memory run --root /tmp/nano/fp8 --jobs t2v,t2i --steps 7 --out OUT/memory-nano.json
    python -m benchmarks.bench_memory run --root /dev/shm/super/fp8 --jobs t2v,t2i --steps 7 --out OUT/memory-super.json
    python -m benchmarks.bench_memory report OUT/memory-*.json

``run`` loads the checkpoint as a farm GPU worker does (its CUDA allocator; the VAE loaded before the first job, so
the resident figure holds it) and renders each of the workload's jobs (benchmarks/common.py ``JOBS``) with
``--steps`` steps: the steps' activations are the same every step of a mode, so a few (7: the published policy's
W8A16 steps 0-2 and 4-6 around one W8A8 step) show the peak a full job reaches. It
plans each job with the same rules `farm plan` uses on this GPU (``--cache``: the step cache the plan assumes and the
render runs; off by default, so the measured peak is every step computed) and records both: resident bytes, the
steps' and the decode's peak allocated, the job's peak allocated and reserved. ``report`` prints them side by side
with the estimate's error against the measured peak (the plan's target: within 10%).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import GIB, JOBS, job_request, machine
from cosmos3.rules.cache_options import METHODS  # torch-free


def do_run(args) -> dict:
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # before torch touches CUDA: the worker's expandable segments
    import dataclasses

    import torch

    from cosmos3.pipeline import Cosmos3Pipeline
    from cosmos3.rules.memory_plan import DEVICE_OVERHEAD, ModelMemory, plan_request
    from cosmos3.rules.request import RequestRules, resolve

    model = ModelMemory.from_checkpoint(args.root)
    rules = RequestRules.from_checkpoint(args.root)
    pipe = Cosmos3Pipeline.from_pretrained(args.root, device="cuda", vae_load="eager", cache=args.cache)
    total = torch.cuda.mem_get_info()[1]
    jobs = []
    for name in args.jobs.split(","):
        request = job_request(name)
        if not rules.recipe.is_distilled:
            request = dataclasses.replace(request, steps=args.steps)
        resolved = resolve(request, rules).request()
        plan = plan_request(model, rules, resolved, cache=args.cache != "off", gpu_memory=total)
        torch.cuda.synchronize()
        out = pipe(request)
        measured = out.memory
        jobs.append({
            "job": name, "steps": resolved.steps, "gen_tokens": plan.gen_tokens,
            "planned": {"resident": model.resident, "steps": model.resident + plan.steps,
                        "decode": model.resident + plan.decode, "peak": plan.peak, "need": plan.need,
                        "tiled": plan.tiled, "overhead": DEVICE_OVERHEAD},
            "measured": {"resident": measured["resident_bytes"],
                         "steps": measured["stage_peak_allocated_bytes"]["steps"],
                         "decode": measured["stage_peak_allocated_bytes"]["vae_decode"],
                         "peak": measured["peak_allocated_bytes"], "reserved": measured["peak_reserved_bytes"],
                         "tiled": measured["vae_decode_tiled"]},
        })
        print(json.dumps(jobs[-1]), flush=True)
    return {"kind": "memory", "machine": machine(), "checkpoint": str(args.root), "cache": args.cache,
            "gpu_bytes": total, "jobs": jobs}


def _gib(value) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def _error(planned, measured) -> str:
    return "-" if not measured or planned is None else f"{100 * (planned - measured) / measured:+.1f}%"


def do_report(args) -> None:
    for path in args.results:
        result = json.loads(Path(path).read_text())
        print(f"### {result['checkpoint']} on {result['machine']} (cache {result['cache']})\n")
        print("| job | tokens | resident GiB plan / measured | steps peak GiB plan / measured | decode peak GiB plan / "
              "measured (tiled) | job peak GiB plan / measured | error | reserved GiB | need GiB |")
        print("|---|---|---|---|---|---|---|---|---|")
        for job in result["jobs"]:
            p, m = job["planned"], job["measured"]
            print(f"| {job['job']} ({job['steps']} steps) | {job['gen_tokens']:,} | {_gib(p['resident'])} / "
                  f"{_gib(m['resident'])} | {_gib(p['steps'])} / {_gib(m['steps'])} | {_gib(p['decode'])} / "
                  f"{_gib(m['decode'])} ({p['tiled']} / {m['tiled']}) | {_gib(p['peak'])} / {_gib(m['peak'])} | "
                  f"{_error(p['peak'], m['peak'])} | {_gib(m['reserved'])} | {_gib(p['need'])} |")
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--root", type=Path, required=True, help="a checkpoint root (bench_render.py write)")
    run.add_argument("--jobs", default="t2v,t2i", help=f"of {', '.join(JOBS)}")
    run.add_argument("--steps", type=int, default=2, help="steps a job runs (the distilled builds run their own)")
    run.add_argument("--cache", default="off", choices=METHODS)
    run.add_argument("--out", type=Path, required=True)
    report = sub.add_parser("report")
    report.add_argument("results", nargs="+")
    args = parser.parse_args()
    if args.command == "report":
        do_report(args)
        return
    result = do_run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
