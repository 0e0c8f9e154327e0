"""Validation time of a seed sweep grows linearly with its seeds (a pairwise check takes 242 s for 100,000).

For each sweep size it validates one manifest (`farm.manifest.load`: read, parse, resolve every job, check
every output path) and prints seconds, microseconds per seed and the ratio of time to the smallest size's
time beside the ratio of sizes: linear growth keeps the two equal. As a baseline, measured in the same run,
a pairwise duplicate check (`seeds.count(s)` per seed) at the small sizes.

    python -m benchmarks.bench_validate --seeds 10000 30000 100000
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from farm import manifest
from testbed.farm_inputs import write_manifest


def _validate(folder: Path, count: int) -> float:
    path = write_manifest(folder, [{"id": "sweep", "prompt": "a red circle", "seeds": list(range(count))}])
    start = time.perf_counter()
    jobs = manifest.load(path).jobs
    seconds = time.perf_counter() - start
    assert len(jobs) == count
    return seconds


def _pairwise_duplicates(count: int) -> float:
    seeds = tuple(range(count))
    start = time.perf_counter()
    repeated = [s for s in seeds if seeds.count(s) > 1]
    seconds = time.perf_counter() - start
    assert not repeated
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--baseline-up-to", type=int, default=30_000, help="largest size for the pairwise check")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print("| check | seeds | seconds | us per seed | time ratio | size ratio |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        rows = [("farm validate", n, _validate(Path(scratch) / str(n), n)) for n in args.seeds]
    rows += [("pairwise count (old rule)", n, _pairwise_duplicates(n)) for n in args.seeds if n <= args.baseline_up_to]
    first = {}
    for check, count, seconds in rows:
        base_count, base_seconds = first.setdefault(check, (count, seconds))
        print(f"| {check} | {count:,} | {seconds:.2f} | {seconds / count * 1e6:.1f} | "
              f"{seconds / base_seconds:.1f} | {count / base_count:.1f} |")


if __name__ == "__main__":
    main()
