"""``bench_render.py report OUT/*.json``, as its docstring says to run it, on an ``--out`` folder that holds the jobs'
sidecars beside the steps' results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "NVIDIA H200, sm_90, 140 GiB, CUDA 13.0, torch 2.13.0"
GIB = 1 << 30


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))


def test_report_on_an_out_folder_reads_the_results_and_passes_over_the_sidecars(tmp_path):
    out = tmp_path / "out"
    _write(out / "write-all.json", {"kind": "write", "machine": MACHINE, "variants": {
        "fp8": {"bytes": 16_500_000_000, "seconds": 41.0, "gb_per_s": 0.40, "shards": 4},
        "bf16": {"skipped": "20.0 GB free on disk, 34 GB needed"}}})
    _write(out / "diffusers-all.json", {"kind": "diffusers", "machine": MACHINE, "steps": [9.5, 4.25, 4.25],
                                        "load_seconds": 61.0, "resident_bytes": 31 * GIB,
                                        "peak_allocated_bytes": 60 * GIB, "peak_reserved_bytes": 64 * GIB})
    # A job's sidecar, beside the results (a glob over the folder matches it) and under sidecars/, where farm copies it.
    sidecar = {"job": {"id": "t2i", "task": "t2i"}, "seed": 1, "worker": {"node": "h200", "ops": {}},
               "media": {"sha256": "0" * 64}}
    _write(out / "sidecar-fp8-t2i.json", sidecar)
    _write(out / "sidecars" / "fp8-t2i.png.json", sidecar)

    report = subprocess.run(f"{sys.executable} benchmarks/bench_render.py report {out}/*.json", shell=True,
                            cwd=ROOT, text=True, capture_output=True, timeout=120)

    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0] == f"Machine: {MACHINE}"
    assert "### Checkpoint written" in lines and '  "shards": 4' in lines
    assert "| per step s | 9.500 / 4.250 / 4.250 |" in lines
    assert "| resident / peak allocated / peak reserved GiB | 31.00 / 60.00 / 64.00 |" in lines


def test_report_on_sidecars_alone_says_what_it_needs(tmp_path):
    _write(tmp_path / "sidecar-fp8-t2i.json", {"job": {"id": "t2i"}})
    report = subprocess.run([sys.executable, "benchmarks/bench_render.py", "report",
                             str(tmp_path / "sidecar-fp8-t2i.json")], cwd=ROOT, text=True, capture_output=True,
                            timeout=120)
    assert report.returncode == 1
    assert "none of 1 files is a bench_render result" in report.stderr
    assert "Traceback" not in report.stderr
