"""``bench_render.py report OUT/*.json``, as its docstring says to run it, on an ``--out`` folder that holds the jobs'
sidecars beside the steps' results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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

    report = subprocess.run(f"{sys.executable} -m benchmarks.bench_render report {out}/*.json", shell=True,
                            cwd=ROOT, text=True, capture_output=True, timeout=120)

    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0] == f"Machine: {MACHINE}"
    assert "### Checkpoint written" in lines and '  "shards": 4' in lines
    assert "| per step s | 9.500 / 4.250 / 4.250 |" in lines
    assert "| resident / peak allocated / peak reserved GiB | 31.00 / 60.00 / 64.00 |" in lines


def test_report_on_sidecars_alone_says_what_it_needs(tmp_path):
    _write(tmp_path / "sidecar-fp8-t2i.json", {"job": {"id": "t2i"}})
    report = subprocess.run([sys.executable, "-m", "benchmarks.bench_render", "report",
                             str(tmp_path / "sidecar-fp8-t2i.json")], cwd=ROOT, text=True, capture_output=True,
                            timeout=120)
    assert report.returncode == 1
    assert "none of 1 files is a bench_render result" in report.stderr
    assert "Traceback" not in report.stderr


EDGES = [0, 1, 2, 32, 33, 34]  # the published step policy's W8A16 steps of 35


def _clip_sidecar(cached: list[int], started: float, publish: float) -> dict:
    """A T2V clip's sidecar as a GPU worker writes it: 35 steps, W8A16 edges at 5.4 s, W8A8 at 3.7 s, cached 0.01 s."""
    steps = [0.01 if i in cached else 5.4 if i in EDGES else 3.7 for i in range(35)]
    total = sum(steps) + 9.5 + 0.3  # the steps, the decode and the rest of the pipeline
    cache = None if not cached else {"method": "seacache", "threshold": 0.25, "max_consecutive": 2,
                                     "computed": [i for i in range(35) if i not in cached], "cached": cached}
    return {
        "job": {"id": "t2v", "task": "t2v", "request": {"width": 1280, "height": 720, "frames": 189, "steps": 35,
                                                         "guidance": 6.0}},
        "precision": "fp8-static", "cache": cache,
        "step_policy": {"first_steps": 3, "last_steps": 3, "a16_steps": EDGES},
        "timings": {"vae_wait": 0.0, "tokenize": 0.01, "vae_encode": None, "und": 0.05, "steps": steps,
                    "vae_decode": 9.5, "media_encode": 2.0, "publish": publish, "total": total},
        "memory": {"resident_bytes": 16 * GIB, "peak_allocated_bytes": 27 * GIB, "peak_reserved_bytes": 30 * GIB,
                   "stage_peak_allocated_bytes": {"steps": (22 if cached else 21) * GIB}},
        "worker_start": {"ops": 0.1, "tokenizer": 7.0, "build": 2.0, "attention_kernels": 2.5, "checkpoint_read": 5.0,
                         "checkpoint_bytes": 16_490_000_000, "checkpoint_gb_per_s": 3.3, "vae": 11.0,
                         "sound_tokenizer": None, "total": 10.0, "worker": 12.0},
        "worker": {"node": "h200", "ops": {"source": "wheel", "seconds": 0.1}},
        "gpu_seconds": total, "gpu_telemetry": None, "cuda_graphs": None,
        "started": started, "finished": started + total + publish,
        "media": {"sha256": "0" * 64, "size_on_disk": 1},
    }


def _farm(cache: str | None, sidecar: dict, attention: str = "fp8") -> dict:
    return {"kind": "farm", "machine": MACHINE, "variant": "fp8", "attention": attention, "cache": cache,
            "command": "python -m farm submit manifest.yaml --no-progress", "exit": 0, "seconds": 200.0,
            "page_cache": "kept", "sidecars": {"t2v": sidecar}}


def test_report_sets_the_uncached_and_the_cached_clip_side_by_side(tmp_path):
    cached = [4, 5, 7, 8, 10, 11, 13, 14, 16, 17, 19, 20, 22, 23, 25, 26]  # 16 of 35, never an edge, two in a row
    _write(tmp_path / "farm-fp8-cache-off.json", _farm("off", _clip_sidecar([], 1000.0, 2.5)))
    _write(tmp_path / "farm-fp8.json", _farm(None, _clip_sidecar(cached, 2000.0, 2.5)))

    report = subprocess.run(f"{sys.executable} -m benchmarks.bench_render report {tmp_path}/*.json", shell=True,
                            cwd=ROOT, text=True, capture_output=True, timeout=120)

    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    uncached_steps = 6 * 5.4 + 29 * 3.7  # 139.7 s
    cached_steps = 6 * 5.4 + 13 * 3.7 + 16 * 0.01  # 80.66 s
    assert "| uncached (`--cache off`) | the default cache |" in "\n".join(lines)
    assert "| step cache | off | seacache, threshold 0.25 |" in lines
    assert "| steps computed / cached | 35 / 0 | 19 / 16 |" in lines
    assert f"| denoising s | {uncached_steps:.2f} | {cached_steps:.2f} |" in lines
    assert "| computed W8A8 step, median s | 3.700 | 3.700 |" in lines
    assert "| W8A16 edge step, median s | 5.400 | 5.400 |" in lines
    assert "| cached step, mean s | null | 0.010 |" in lines
    assert f"| uncached / cached, denoising | | {uncached_steps / cached_steps:.2f}x |" in lines
    end_to_end = (uncached_steps + 9.8 + 2.5) / (cached_steps + 9.8 + 2.5)
    assert f"| uncached / cached, job, render start to published | | {end_to_end:.2f}x |" in lines
    assert "| peak allocated during the steps GiB | 21.00 | 22.00 |" in lines
    # The targets are the default cache's run: its clip's GPU-seconds against its own steps and decode.
    over = 100 * ((cached_steps + 9.8) / (cached_steps + 9.5) - 1)
    assert "| FP8 T2V GPU-seconds within 5% of steps (2 forwards each) + VAE decode | " \
           f"{cached_steps + 9.8:.1f} s vs {cached_steps + 9.5:.1f} s: {over:+.1f}% | yes |" in lines


def test_report_counts_two_clips_back_to_back_an_hour(tmp_path):
    first = _clip_sidecar([], 1000.0, 2.5)  # finishes at 1000 + 139.7 + 9.8 + 2.5
    second = {**_clip_sidecar([], first["finished"] - 2.5, 2.5), "job": {**first["job"], "id": "t2v-seed2"}}
    _write(tmp_path / "farm-fp8.json", {**_farm(None, first), "sidecars": {"t2v": first, "t2v-seed2": second}})

    report = subprocess.run(f"{sys.executable} -m benchmarks.bench_render report {tmp_path}/*.json", shell=True,
                            cwd=ROOT, text=True, capture_output=True, timeout=120)

    assert report.returncode == 0, report.stderr
    span = second["finished"] - 1000.0  # the second rendered while the first published
    assert (f"| first clip started to last one published | {span:.1f} s: {7200 / span:.1f} clips an hour on one "
            "GPU |") in report.stdout.splitlines()


def _report(folder: Path) -> list[str]:
    report = subprocess.run(f"{sys.executable} -m benchmarks.bench_render report {folder}/*.json", shell=True,
                            cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert report.returncode == 0, report.stderr
    return report.stdout.splitlines()


def test_report_sets_clips_of_two_attention_choices_side_by_side(tmp_path):
    """Runs that differ only in ``--attention`` both stay in the report, ``fp8`` first, its time over the other's."""
    cached = [4, 5, 7, 8]
    fp8 = _clip_sidecar(cached, 1000.0, 0.6)
    edges_fp8 = _clip_sidecar(cached, 2000.0, 0.6)
    for i in EDGES:
        edges_fp8["timings"]["steps"][i] = 4.6
    edges_fp8["timings"]["total"] -= 6 * 0.8
    edges_fp8["finished"] -= 6 * 0.8
    _write(tmp_path / "all" / "farm-fp8.json", _farm(None, edges_fp8, "fp8-all-steps"))
    _write(tmp_path / "fp8" / "farm-fp8.json", _farm(None, fp8))

    lines = _report(tmp_path / "*")

    assert sum(line.startswith("`python -m farm submit") for line in lines) == 2
    assert "| figure | `--attention fp8` | `--attention fp8-all-steps` |" in lines
    assert "| W8A16 edge step, median s | 5.400 | 4.600 |" in lines
    steps = sum(fp8["timings"]["steps"])
    assert f"| denoising s | {steps:.2f} | {steps - 4.8:.2f} |" in lines
    published = fp8["finished"] - fp8["started"]
    assert (f"| `--attention fp8` / this, job, render start to published | | {published / (published - 4.8):.2f}x |"
            in lines)


def test_report_says_whether_forced_rerenders_were_byte_identical(tmp_path):
    first, other = {"t2i": "a" * 64, "t2v-half": "b" * 64}, {"t2i": "a" * 64, "t2v-half": "c" * 64}
    _write(tmp_path / "farm-fp8.json", {**_farm(None, _clip_sidecar([], 1000.0, 0.6)), "rerenders": {
        "sha256": [first, first, other], "identical": {"t2i": True, "t2v-half": False}}})

    lines = _report(tmp_path)

    assert "### Forced re-renders: the first render and 2 more with `--force`, a fresh worker each" in lines
    assert "| t2i | aaaaaaaaaaaaaaaa | yes |" in lines
    assert "| t2v-half | bbbbbbbbbbbbbbbb | NO |" in lines


def test_a_farm_run_never_replaces_a_result_of_another_attention_choice(tmp_path):
    """The result's name carries the variant and cache only: a run of another --attention into the same --out is
    refused before it starts, and the result already there is kept."""
    held = _farm(None, _clip_sidecar([], 1000.0, 0.6))
    _write(tmp_path / "out" / "farm-fp8.json", held)
    run = subprocess.run([sys.executable, "-m", "benchmarks.bench_render", "farm", "--root", str(tmp_path / "nano"),
                          "--attention", "fp8-all-steps", "--jobs", "t2v", "--out", str(tmp_path / "out")],
                         cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert run.returncode == 2
    assert "farm-fp8.json holds a farm run with --attention fp8; this one (--attention fp8-all-steps) would " \
           "replace it: give it another --out" in run.stderr
    assert json.loads((tmp_path / "out" / "farm-fp8.json").read_text()) == held
    assert not (tmp_path / "nano").exists()  # nothing was written for the run


def test_a_failed_forced_rerender_never_counts_as_byte_identical(tmp_path, monkeypatch, capsys):
    """A failed ``--force`` submit leaves the first render's files in place: their hashes match, but prove nothing;
    its output is printed, as the first submit's is."""
    from benchmarks import bench_render

    monkeypatch.setattr(bench_render, "wait_for_idle_gpu", lambda: 0.0)
    job = {"id": "t2i", "task": "t2i"}
    sidecar = tmp_path / "renders" / "t2i" / "t2i.png.json"
    _write(sidecar, {"media": {"sha256": "a" * 64}})
    passing = [sys.executable, "-c", "pass"]
    failing = [sys.executable, "-c", "raise SystemExit('the worker could not start')"]

    log = tmp_path / "logs" / "fp8.log"
    assert bench_render._rerenders(tmp_path, [job], passing, 2, log)["identical"] == {"t2i": True}
    failed = bench_render._rerenders(tmp_path, [job], failing, 2, log)
    assert failed["exits"] == [1, 1]
    assert failed["identical"] == {"t2i": False}
    assert capsys.readouterr().out.count("the worker could not start") == 2
    for number in (1, 2):  # each forced submit's output is kept in its own log
        assert "the worker could not start" in (tmp_path / "logs" / f"fp8-force{number}.log").read_text()


def test_a_failed_farm_submit_fails_the_benchmark_and_keeps_its_result(tmp_path, monkeypatch):
    from benchmarks import bench_render

    result = {**_farm(None, _clip_sidecar([], 1000.0, 0.6)), "exit": 1,
              "rerenders": {"sha256": [], "exits": [0, 2], "identical": {}}}
    monkeypatch.setitem(bench_render.KINDS, "farm", lambda args: result)
    monkeypatch.setattr(sys, "argv", ["bench_render", "farm", "--root", str(tmp_path), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as stop:
        bench_render.main()
    assert str(stop.value) == ("farm submit exited 1; the forced re-renders exited [0, 2]: the result is kept for "
                               "its report; the run's log is above")
    assert json.loads((tmp_path / "out" / "farm-fp8.json").read_text()) == result


def test_a_submits_output_is_in_its_log_as_it_runs(tmp_path):
    """Both streams go straight to the log file, in order (nothing waits in a pipe for the end), and the exit status
    comes back."""
    from benchmarks import bench_render

    log = tmp_path / "logs" / "fp8.log"
    command = [sys.executable, "-c", "import sys; print('step 1', flush=True); "
               "print('worker died', file=sys.stderr, flush=True); raise SystemExit(3)"]
    assert bench_render._submit(command, log) == 3
    assert log.read_text().splitlines() == ["step 1", "worker died"]
