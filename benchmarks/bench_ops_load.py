"""Ops ready on a GPU node: the prebuilt wheel (no toolkit) against the JIT build and its cache.

Every case is a fresh Python process, as a worker starting on a node: it imports torch, initialises CUDA,
loads the cosmos3 ops, checks one call of each op on the GPU against its CPU impl bit for bit and prints a
JSON line. Cases:

- prebuilt: ``--prebuilt DIR`` is where the wheel was installed (``pip install --no-deps --target DIR``); these
  processes run with nvcc hidden (no PATH entry holding nvcc, CUDA_HOME and CUDA_PATH unset), ``--repeats`` times.
- JIT, concurrent first loads: ``--concurrent`` processes from the checkout ``--source`` start at once on an
  empty build directory, as the workers of one node do: one builds, the others wait on the node's lock and
  load its result (the lock works if exactly one says jit-build and every process passes its check).
- JIT cache: then ``--repeats`` more processes load the cached build one at a time.

    python -m benchmarks.bench_ops_load --prebuilt /tmp/c3 --source . --deps /tmp/site --concurrent 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import machine

CHILD = r"""
import json, shutil, time
start = time.perf_counter()
import torch
torch.cuda.init()
cuda_ready = time.perf_counter()
from cosmos3 import ops
loaded = ops.load_cuda_ops()
gate, up = (torch.randn(4096, device="cuda") * 3).bfloat16(), torch.randn(4096, device="cuda").bfloat16()
scale = torch.tensor([0.02], device="cuda")
bits = lambda t: t.cpu().view(torch.uint8)
cpu = lambda v: v.cpu() if isinstance(v, torch.Tensor) else v
same = lambda op, *args, **kw: torch.equal(bits(op(*args, **kw)),
                                           bits(op(*map(cpu, args), **{k: cpu(v) for k, v in kw.items()})))
exact = (same(ops.quantize_fp8, gate, scale) and same(ops.silu_and_mul_2in, gate, up, scale=scale)
         and same(ops.dequantize_fp8, ops.quantize_fp8(gate, scale), scale, torch.bfloat16))
print(json.dumps({"source": loaded.source, "load_s": loaded.seconds, "torch_cuda_s": cuda_ready - start,
                  "process_s": time.perf_counter() - start, "bit_exact": exact, "cosmos3": ops.__file__,
                  "nvcc": shutil.which("nvcc"), "library": loaded.path}))
"""


def _env(package_path: Path, deps: str | None, *, hide_nvcc: bool, build_dir: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(package_path), deps]))}
    if hide_nvcc:
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not Path(p, "nvcc").exists())
        env.pop("CUDA_HOME", None)
        env.pop("CUDA_PATH", None)
    if build_dir is not None:
        env["COSMOS3_BUILD_DIR"] = str(build_dir)
    return env


def _start(env: dict, cwd: str) -> subprocess.Popen:
    # cwd: a scratch dir, so `python -c` (which puts cwd first on sys.path) imports cosmos3 from PYTHONPATH only.
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"a load failed (exit {process.returncode}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    if not result["bit_exact"]:
        raise SystemExit(f"the ops from {result['library']} disagree with their CPU impls")
    return result


def _row(case: str, results: list[dict], baseline: float | None) -> str:
    sources = ", ".join(f"{n} {s}" for s, n in sorted(Counter(r["source"] for r in results).items()))
    load = statistics.median(r["load_s"] for r in results)
    process = statistics.median(r["process_s"] for r in results)
    ratio = f"{load / baseline:.1f}x" if baseline else "1.0x"
    return f"| {case} | {len(results)} | {sources} | {load:.3f} | {max(r['load_s'] for r in results):.3f} | " \
           f"{process:.2f} | {ratio} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prebuilt", type=Path, required=True, help="where the wheel was installed (--target)")
    parser.add_argument("--source", type=Path, help="a checkout to JIT-build from (omit: prebuilt only)")
    parser.add_argument("--deps", help="extra PYTHONPATH for the processes (structlog where it is not installed)")
    parser.add_argument("--concurrent", type=int, default=4, help="JIT processes started at once")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    print(f"GPU {machine()}")
    scratch = tempfile.mkdtemp(prefix="bench_ops_load_")
    prebuilt = [_finish(_start(_env(args.prebuilt, args.deps, hide_nvcc=True), scratch)) for _ in range(args.repeats)]
    print(f"prebuilt: cosmos3 from {prebuilt[0]['cosmos3']}, library {prebuilt[0]['library']}, "
          f"nvcc on PATH: {prebuilt[0]['nvcc']}")
    baseline = statistics.median(r["load_s"] for r in prebuilt)
    rows = [_row("prebuilt wheel, nvcc hidden", prebuilt, None)]
    if args.source is not None:
        build_dir = Path(scratch) / "jit"
        env = _env(args.source.resolve(), args.deps, hide_nvcc=False, build_dir=build_dir)
        started = time.perf_counter()
        first = [_finish(p) for p in [_start(env, scratch) for _ in range(args.concurrent)]]
        wall = time.perf_counter() - started
        cached = [_finish(_start(env, scratch)) for _ in range(args.repeats)]
        rows += [_row(f"JIT, {args.concurrent} first loads at once (wall {wall:.1f} s)", first, baseline),
                 _row("JIT cache, one at a time", cached, baseline)]
        builds = sum(r["source"] == "jit-build" for r in first)
        print(f"concurrent first loads: {builds} built, {len(first) - builds} loaded the cache "
              f"({'one build per node' if builds == 1 else 'NOT one build per node'})")
    print()
    print("| case | processes | sources | ops load s (median) | max s | process s (median) | load vs prebuilt |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n(ops load: load_cuda_ops() until the kernels are ready; process: python start to the checked calls, "
          "torch import and CUDA init included)")


if __name__ == "__main__":
    main()
