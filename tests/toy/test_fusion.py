"""TensorRT-LLM PR #17476's measurement (docs/checkpoints.md, source S16), repeated on the toy checkpoint.

``benchmarks/bench_fp8_fusion.py --fp8 checkpoints/toy/fp8 --bf16 checkpoints/toy/bf16``: how many of a
trained, calibrated checkpoint's Q/K/V and gate/up shards a max(scale) fusion would re-quantize, and
the error that adds relative to the numerical floor. Our loader keeps them split; this records why.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "checkpoints" / "toy"


def test_fusion_benchmark_runs_on_the_toy_checkpoint_and_finds_shards_to_requantize():
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_fp8_fusion.py"), "--fp8", str(TOY / "fp8"),
         "--bf16", str(TOY / "bf16")],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout
    print(out)
    row = out.strip().splitlines()[-1]
    groups, shards = (cell.strip() for cell in row.strip("|").split("|")[:2])
    altered, total = (int(n) for n in groups.split()[0].split("/"))
    assert total == 16 and altered > 0, row  # 4 layers x (UND, GEN) x (qkv, gate/up)
    assert not shards.startswith("0/"), row
