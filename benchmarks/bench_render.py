"""The production workload through the farm on one GPU: Nano-shaped FP8 (and BF16) clips and stills.

Steps (each fits one device call; run them on one machine, in this order):

    python -m benchmarks.bench_render write --root /tmp/nano                # fp8/ (and bf16/ if the disk allows)
    python -m benchmarks.bench_render farm --root /tmp/nano --variant fp8 --jobs t2i,t2v --out $OUT
    python -m benchmarks.bench_render farm --root /tmp/nano --jobs t2v --cache off --out $OUT   # beside the default
    python -m benchmarks.bench_render farm --root /tmp/nano --jobs "" --stills 200 --prompts 50 --out $OUT
    python -m benchmarks.bench_render diffusers --root /tmp/nano --steps 3 --out $OUT
    python -m benchmarks.bench_render report $OUT/*.json > results.md    # the jobs' sidecars: $OUT/sidecars/

``write`` streams random weights to disk in the published layout (benchmarks/random_checkpoint.py).
``farm`` renders the workload's manifest with ``python -m farm submit`` (a fresh worker: its start is the
warm start, ops built, its big imports byte-compiled as pip leaves them, checkpoint on local disk, page cache
dropped first with ``--drop-caches``),
then turns every job's sidecar into a table. Each submit's output goes to ``$OUT/logs/`` as it runs, so a run cut
short still shows how far it came. ``--cache`` sets the manifest's step cache (``off``, ``seacache``;
unset: the pipeline's default); with a run of each in one ``OUT``, the report sets the clip's cached and uncached
figures side by side. ``--stills N`` adds a farm's stream of the workload's stills: N of
them over ``--prompts`` prompts of varied lengths, each prompt with a few seeds, shuffled, so a prompt length comes
back now and then as in a studio's day; the report gives the distribution of their denoising times, split by
what each still's CUDA graphs did (sidecar ``cuda_graphs``). ``diffusers`` runs ``Cosmos3OmniPipeline`` on the BF16
variant (the same weights, dequantized) for a few steps of the T2V job: per-step time and peak memory.
``report`` prints the tables and the workload's targets from the saved JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import BUILD_NAMES, GIB, JOBS, PROMPT, drop_page_cache, job_request, machine, stream_order
from cosmos3.rules.attention_choice import ATTENTION_CHOICES  # torch-free
from cosmos3.rules.cache_options import METHODS  # torch-free

# -- write -----------------------------------------------------------------------------------------


def do_write(args) -> dict:
    """``ROOT/VARIANT`` of ``--build``, then ``ROOT/NAME`` of each ``--link`` build, hard-linked to its weights."""
    from benchmarks.random_checkpoint import BUILDS, link_build, plan_entries, write_checkpoint

    build = BUILDS[args.build]
    results = {}
    for variant in args.variants:
        free = shutil.disk_usage(args.root.parent if not args.root.exists() else args.root).free
        need = sum(entry.nbytes for entry in plan_entries(build.transformer, variant)) * 1.05 + 2e9  # + VAE, slack
        if free < need:
            results[variant] = {"skipped": f"{free / 1e9:.1f} GB free on disk, {need / 1e9:.0f} GB needed"}
            continue
        stats = write_checkpoint(args.root / variant, variant=variant, device=args.device, build=build,
                                 words=tuple(PROMPT.replace(",", " ").split()))
        results[variant] = {"build": args.build, "bytes": stats.bytes, "seconds": stats.seconds,
                            "gb_per_s": stats.gb_per_s, "shards": stats.shards}
        print(f"{args.build} {variant}: {stats.bytes / 1e9:.2f} GB in {stats.shards} shards, {stats.seconds:.1f} s "
              f"({stats.gb_per_s:.2f} GB/s)", flush=True)
    for name in args.link:
        link_build(args.root / args.variants[0], args.root / name, BUILDS[name], args.variants[0])
        results[name] = {"build": name, "linked_to": args.variants[0]}
        print(f"{name}: linked to {args.root / args.variants[0]}", flush=True)
    return {"kind": "write", "machine": machine(), "variants": results}


# -- farm ------------------------------------------------------------------------------------------


def workload_jobs(names: list[str]) -> list[dict]:
    """The workload's jobs ``JOBS[name]`` as manifest entries, with ``PROMPT``."""
    return [{**JOBS[name], "prompt": PROMPT} for name in names]


# Words a stream's prompts add to PROMPT (one to two tokens each).
STREAM_WORDS = ("with glass towers reflecting an orange sky while ferries cross the bay under low clouds as gulls "
                "circle the old lighthouse and rain begins to fall on the quiet promenade").split()


STREAM_PREFIX = "still-"  # a stream still's job id


def stream_jobs(stills: int, prompts: int) -> list[dict]:
    """``stills`` of the workload's T2I over ``prompts`` prompts of ``PROMPT`` plus 0 to 119 words (seeded): the prompts
    in shuffled passes, a new seed each pass, so a prompt's length comes back after about ``prompts`` stills. The
    lengths span the 128- and 256-row buckets of cuda_graphs.prefix_rows."""
    import random

    rng = random.Random(15)
    texts = [" ".join([PROMPT + ","] + rng.choices(STREAM_WORDS, k=rng.randrange(120))) for _ in range(prompts)]
    order = stream_order(prompts, -(-stills // prompts), "shuffled")[:stills]
    seen = dict.fromkeys(range(prompts), 0)
    jobs = []
    for i, n in enumerate(order):
        seen[n] += 1
        jobs.append({**JOBS["t2i"], "id": f"{STREAM_PREFIX}{i:03d}", "prompt": texts[n], "seed": seen[n],
                     "priority": 0})
    return jobs


def write_manifest(folder: Path, checkpoint: Path, variant: str, jobs: list[dict], attention: str = "auto",
                   cache: str | None = None) -> Path:
    """A manifest of ``jobs`` (manifest entries: ``workload_jobs``, ``stream_jobs``) on the checkpoint; ``cache``: its
    model's step cache (None: the key is left out, so the pipeline's default holds)."""
    import imageio.v3 as iio
    import numpy as np
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    if any(job["task"] == "i2v" for job in jobs):
        (folder / "inputs").mkdir(exist_ok=True)
        frame = np.random.default_rng(0).integers(0, 256, size=(720, 1280, 3), dtype=np.uint8)
        iio.imwrite(folder / "inputs" / "frame.png", frame)
    model = {"checkpoint": str(checkpoint), "precision": "auto", "step_precision": "auto", "attention": attention}
    manifest = {
        "version": 1, "name": f"bench-{variant}",
        "model": model if cache is None else {**model, "cache": cache},
        "output": {"root": str(folder / "renders"), "path": "{task}/{id}"},
        "defaults": {"retries": 0, "timeout": "20m", "fps": 24},
        "jobs": jobs,
    }
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def wait_for_idle_gpu(limit: float = 120.0) -> float:
    """Seconds waited until no process holds GPU memory, so a run's worker does not start while the previous run's
    is still exiting (of two runs back to back, the second allocated the Nano model in 3.9 s, the first in 0.9 s)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.split()
        if not apps:
            break
        time.sleep(1.0)
    return time.perf_counter() - started


def compile_bytecode() -> float:
    """Seconds to byte-compile every folder on ``sys.path`` (the environment and this tree), as pip and the
    distribution do when they install: the device's carried wheels are installed ``--no-compile``, and it keeps no
    bytecode a process compiles (its torch is read-only there: run with ``PYTHONPYCACHEPREFIX=<a writable
    folder>``; the worker and this compile both honour it). A worker's imports reach far beyond torch, diffusers
    and transformers (sympy, scipy, scikit-learn: 8.6 s of compiling in a transformers import on the H200 host).
    What the worker still had to compile is in its sidecars (``worker.uncached_bytecode``) and in the report."""
    import compileall

    started = time.perf_counter()
    for folder in dict.fromkeys(sys.path):
        if folder and Path(folder).is_dir():
            compileall.compile_dir(folder, quiet=2, workers=0)  # quiet=2: a read-only folder fails file by file
    return time.perf_counter() - started


def run_tag(variant: str, cache: str | None) -> str:
    """A farm run's name in ``OUT`` (its result and its sidecars): the variant, and the cache where one was set."""
    return variant if cache is None else f"{variant}-cache-{cache}"


def _other_attention(result: Path, attention: str) -> str | None:
    """Why a farm run must not write ``result``: it holds a run of another attention choice (the file name carries
    the variant and cache, not the attention), or None."""
    try:
        held = json.loads(result.read_text()).get("attention")
    except (OSError, ValueError, AttributeError):
        return None
    if held is None or held == attention:
        return None
    return (f"{result} holds a farm run with --attention {held}; this one (--attention {attention}) would replace it: "
            "give it another --out")


def _collect(folder: Path, out: Path, tag: str, stop: threading.Event) -> None:
    """Copies each sidecar of the workload's jobs to ``out`` as soon as it is published: a run cut short still reports
    its jobs (a stream's stills are many: they are in the run's JSON only)."""
    while not stop.wait(5.0):
        for sidecar in (folder / "renders").glob("*/*.json"):
            if sidecar.name.startswith(STREAM_PREFIX):
                continue
            shutil.copyfile(sidecar, out / "sidecars" / f"{tag}-{sidecar.name}")


def do_farm(args) -> dict:
    checkpoint = args.root / args.variant
    tag = run_tag(args.variant, args.cache)
    folder = args.root / f"run-{tag}-{args.attention}"
    shutil.rmtree(folder, ignore_errors=True)
    jobs = workload_jobs([name for name in args.jobs.split(",") if name]) + stream_jobs(args.stills, args.prompts)
    manifest = write_manifest(folder, checkpoint, args.variant, jobs, args.attention, args.cache)
    compiled = compile_bytecode()
    waited = wait_for_idle_gpu()
    cache = drop_page_cache() if args.drop_caches else "kept"
    (args.out / "sidecars").mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    collector = threading.Thread(target=_collect, args=(folder, args.out, tag, stop), daemon=True)
    collector.start()
    started = time.perf_counter()
    command = [sys.executable, "-m", "farm", "submit", str(manifest), "--no-progress"]
    log = args.out / "logs" / f"{tag}.log"
    code = _submit(command, log)
    seconds = time.perf_counter() - started
    stop.set()
    collector.join()
    _print_tail(log)
    rerenders = _rerenders(folder, jobs, command, args.rerenders, log) if args.rerenders else None
    sidecars = {}
    for job in jobs:
        media = _media(folder, job)
        sidecar = Path(f"{media}.json")
        if sidecar.is_file():
            sidecars[job["id"]] = json.loads(sidecar.read_text())
            sidecars[job["id"]]["media"]["size_on_disk"] = media.stat().st_size
    summaries = sorted((folder / "renders" / ".farm").glob("*/runs/*.json"))
    return {"kind": "farm", "machine": machine(), "variant": args.variant, "attention": args.attention,
            "cache": args.cache,
            "command": " ".join(command),
            "exit": code, "seconds": seconds, "page_cache": cache, "waited_for_idle_gpu": waited,
            "bytecode_compile_seconds": compiled,
            "sidecars": sidecars, "rerenders": rerenders,
            "summary": json.loads(summaries[-1].read_text()) if summaries else None}


def _media(folder: Path, job: dict) -> Path:
    """Where the farm publishes ``job``'s media in the run's ``folder``."""
    return folder / "renders" / job["task"] / (job["id"] + (".png" if job["task"] == "t2i" else ".mp4"))


def _media_sha256(folder: Path, jobs: list[dict]) -> dict[str, str | None]:
    """Each job's published media sha256, as its sidecar records it (None: not published)."""
    found = {}
    for job in jobs:
        media = _media(folder, job)
        sidecar = Path(f"{media}.json")
        found[job["id"]] = json.loads(sidecar.read_text())["media"]["sha256"] if sidecar.is_file() else None
    return found


def _submit(command: list[str], log: Path) -> int:
    """One farm submit, its output and log written to ``log`` as they come: a run cut short (a device call's time
    running out) still leaves its progress there. Returns its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        return subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT).returncode


def _print_tail(log: Path) -> None:
    """The end of a farm submit's output and log, where a failed run says why."""
    print(log.read_text(errors="replace")[-8000:], flush=True)


def _rerenders(folder: Path, jobs: list[dict], command: list[str], times: int, log: Path) -> dict:
    """The manifest rendered ``times`` more times with ``--force``, each by a fresh worker: every job's media sha256
    per render, each submit's exit status, and whether all of them are byte-identical. A failed submit leaves the
    earlier render's files in place, so its hashes prove nothing: a job counts identical only if every submit
    exited 0. Each submit's output goes beside the first one's ``log``, numbered."""
    renders = [_media_sha256(folder, jobs)]
    exits = []
    for number in range(1, times + 1):
        wait_for_idle_gpu()
        forced = log.with_name(f"{log.stem}-force{number}.log")
        code = _submit([*command, "--force"], forced)
        if code:
            _print_tail(forced)
        exits.append(code)
        renders.append(_media_sha256(folder, jobs))
    identical = {job["id"]: not any(exits) and len({r[job["id"]] for r in renders}) == 1
                 and renders[0][job["id"]] is not None for job in jobs}
    return {"sha256": renders, "exits": exits, "identical": identical}


def failed_submits(result: dict) -> str | None:
    """What failed in a farm run (its submit or a forced re-render's exit status), or None."""
    exits = [result["exit"], *(result.get("rerenders") or {}).get("exits", [])]
    if not any(exits):
        return None
    return (f"farm submit exited {exits[0]}" + (f"; the forced re-renders exited {exits[1:]}" if exits[1:] else "")
            + ": the result is kept for its report; the run's log is above")


# -- direct: the pipeline without the farm, for what a farm run cannot isolate -----------------------


def _peak_decode(vae, latents, tiled: bool) -> dict:
    """One decode's seconds and peak memory, by ``vae`` (a ``cosmos3.vae.WanVAE``) tiled or not."""
    import torch

    from cosmos3.media import to_uint8_frames

    vae.force_tiling = tiled
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    started = time.perf_counter()
    to_uint8_frames(vae.decode(latents))
    torch.cuda.synchronize()
    # what ran: fastvae's decoder decodes in temporal chunks whatever tiling asks
    return {"tiled": vae.last_decode_tiled, "decoder": vae.decoder, "dtype": str(vae.dtype).removeprefix("torch."),
            "seconds": time.perf_counter() - started, "resident_bytes": resident,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved()}


def do_direct(args) -> dict:
    """Worker start, T2I twice (the second is a warm worker's), and (unless ``--no-decodes``) one T2V latent decoded
    untiled and tiled (and untiled in fp32, for comparison). The process's CUDA allocator and VAE load (in the
    background, waited for by the first T2I) are a farm GPU worker's."""
    from worker.gpu import configure_cuda_allocator

    configure_cuda_allocator()  # before torch touches CUDA
    from cosmos3.pipeline import Cosmos3Pipeline

    cache = drop_page_cache() if args.drop_caches else "kept"
    started = time.perf_counter()
    pipe = Cosmos3Pipeline.from_pretrained(args.root / "fp8", device="cuda", vae_load="background")
    wall = time.perf_counter() - started
    t2i = [pipe(job_request("t2i")) for _ in range(2)]
    load = {**pipe.load_timings, "wall": wall, "page_cache": cache}  # after a job: the VAE's build has ended
    decodes = [] if args.no_decodes else _decodes(pipe, args.root / "fp8" / "vae")
    return {"kind": "direct", "machine": machine(), "load": load, "decodes": decodes,
            "t2i": [{"timings": o.timings, "memory": o.memory} for o in t2i]}


def _decodes(pipe, vae_dir: Path) -> list[dict]:
    """One T2V latent decoded by the worker's VAE (bf16 on CUDA) untiled and tiled, and by an fp32 VAE untiled."""
    import torch

    from cosmos3.vae import WanVAE

    torch.set_grad_enabled(False)  # the pipeline's own calls run in inference mode; these bare decodes must too
    shape = pipe.vae.config.latent_shape(189, 720, 1280)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(0)).cuda()  # [48, 48, 45, 80]
    decodes = [_peak_decode(pipe.vae, latents, tiled) for tiled in (False, True)]
    pipe.vae.force_tiling = None
    fp32 = WanVAE.from_pretrained(vae_dir, device=torch.device("cuda"), dtype=torch.float32)
    return decodes + [_peak_decode(fp32, latents, False)]


# -- diffusers -------------------------------------------------------------------------------------


def do_diffusers(args) -> dict:
    import torch
    from diffusers import Cosmos3OmniPipeline

    job = JOBS["t2v"]
    started = time.perf_counter()
    pipe = Cosmos3OmniPipeline.from_pretrained(str(args.root / "bf16"), torch_dtype=torch.bfloat16,
                                               enable_safety_checker=False, device_map="cuda")
    load = time.perf_counter() - started
    stamps = []

    def on_step(pipeline, step, timestep, kwargs):
        torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        return kwargs

    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    pipe(prompt=PROMPT, negative_prompt="", num_frames=job["frames"], width=job["size"][0], height=job["size"][1],
         fps=24.0, num_inference_steps=args.steps, guidance_scale=job["guidance"], output_type="latent",
         generator=torch.Generator("cpu").manual_seed(0), callback_on_step_end=on_step)
    steps = [b - a for a, b in zip([begin, *stamps[:-1]], stamps, strict=True)]  # the first includes tokenize + set-up
    return {"kind": "diffusers", "machine": machine(), "steps": steps, "load_seconds": load,
            "resident_bytes": resident, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved()}


# -- report ----------------------------------------------------------------------------------------


def _s(value, digits: int = 2) -> str:
    return "null" if value is None else f"{value:.{digits}f}"


def _gib(value) -> str:
    return "null" if value is None else f"{value / GIB:.2f}"


def _clocks(telemetry: dict | None) -> str:
    if not telemetry or telemetry["samples"] is None:
        return "null"
    median, low = telemetry["sm_clock_mhz_median"], telemetry["sm_clock_mhz_min"]
    return f"{median:.0f} / {low:.0f} ({telemetry['samples']} samples)"


def _power(telemetry: dict | None) -> str:
    if not telemetry or telemetry["samples"] is None:
        return "null"
    return (f"{telemetry['power_w_mean']:.0f} / {telemetry['power_limit_w']:.0f}; "
            f"{100 * telemetry['power_capped_share']:.0f}% / {100 * telemetry['thermal_share']:.0f}%")


def job_table(job: str, record: dict) -> list[str]:
    t, m, start = record["timings"], record["memory"], record["worker_start"]
    steps = t["steps"]
    r = record["job"]["request"]  # the resolved request (farm.job.Job wraps it)
    lines = [f"### {record['precision']} {job}: {r['width']}x{r['height']}, "
             f"{r['frames']} frames, {r['steps']} steps, guidance {r['guidance']}",
             "", "| stage | value |", "|---|---|"]
    rows = [
        ("worker start: ops load s", _s(start["ops"])),
        ("worker start: text tokenizer load s", _s(start.get("tokenizer"))),
        ("worker start: model allocate s", _s(start["build"])),
        ("worker start: attention kernels ready s", _s(start.get("attention_kernels"))),
        ("worker start: checkpoint read s (GB, GB/s)",
         f"{_s(start['checkpoint_read'])} ({start['checkpoint_bytes'] / 1e9:.2f} GB, "
         f"{_s(start['checkpoint_gb_per_s'])} GB/s)"),
        ("worker start: VAE load s", _s(start["vae"])),
        ("worker start: sound tokenizer load s (background)", _s(start.get("sound_tokenizer"))),
        ("worker start: warm-up s (the builds waited for, the decoder's set-up per size)", _s(start.get("warm_up"))),
        ("worker start: pipeline load s / whole worker start s", f"{_s(start['total'])} / {_s(start['worker'])}"),
        ("VAE wait s (for its and the sound tokenizer's background builds; 0 once built)", _s(t.get("vae_wait"), 3)),
        ("tokenize s", _s(t["tokenize"], 3)),
        ("VAE encode s", _s(t["vae_encode"])),
        ("UND (both CFG branches) s", _s(t["und"], 3)),
        (f"steps: {len(steps)}, median / min / max s",
         f"{statistics.median(steps):.3f} / {min(steps):.3f} / {max(steps):.3f}"),
        ("steps: sum s", _s(sum(steps))),
        ("VAE decode s", _s(t["vae_decode"])),
        ("media encode (PNG / MP4) s", _s(t["media_encode"])),
        ("publish (encode + hash + fsync + rename) s", _s(t["publish"])),
        ("pipeline total s", _s(t["total"])),
        ("GPU-seconds for the job", _s(record["gpu_seconds"])),
        ("GPU while rendering: SM clock median / min MHz", _clocks(record.get("gpu_telemetry"))),
        ("GPU while rendering: power mean / limit W; samples held by the power cap / by heat",
         _power(record.get("gpu_telemetry"))),
        ("GPU memory resident at start GiB", _gib(m["resident_bytes"])),
        ("peak max_memory_allocated GiB", _gib(m["peak_allocated_bytes"])),
        ("peak max_memory_reserved GiB", _gib(m["peak_reserved_bytes"])),
    ]
    rows += [(f"peak allocated during {stage} GiB", _gib(v)) for stage, v in m["stage_peak_allocated_bytes"].items()]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return lines + [""]


def targets(farm: dict, diffusers: dict | None, bf16: dict | None) -> list[str]:
    lines = ["### Targets", "", "| target | measured | met |", "|---|---|---|"]
    jobs = farm["sidecars"]
    if any(record["gpu_seconds"] is None for record in jobs.values()):
        return lines[:2] + ["(rendered on the CPU: the targets are for the GPU)", ""]
    if "t2v" in jobs:
        t = jobs["t2v"]["timings"]
        expected = sum(t["steps"]) + t["vae_decode"]
        ratio = jobs["t2v"]["gpu_seconds"] / expected
        lines.append(f"| FP8 T2V GPU-seconds within 5% of steps (2 forwards each) + VAE decode | "
                     f"{jobs['t2v']['gpu_seconds']:.1f} s vs {expected:.1f} s: {100 * (ratio - 1):+.1f}% | "
                     f"{'yes' if ratio <= 1.05 else 'no'} |")
        peak = jobs["t2v"]["memory"]["peak_reserved_bytes"]
        allocated = jobs["t2v"]["memory"]["peak_allocated_bytes"]
        lines.append(f"| FP8 T2V peak GPU memory <= 34 GB | allocated {allocated / 1e9:.1f} GB, reserved "
                     f"{peak / 1e9:.1f} GB | {'yes' if peak <= 34e9 else 'no'} |")
        if diffusers:
            ours = statistics.median(native_steps(jobs["t2v"]))
            theirs = statistics.median(diffusers["steps"][1:] or diffusers["steps"])
            met = "yes" if theirs / ours >= 1.5 else "no"
            lines.append(f"| FP8 per step >= 1.5x diffusers per step (same weights, BF16) | ours {ours:.2f} s, "
                         f"diffusers {theirs:.2f} s: {theirs / ours:.2f}x | {met} |")
        if bf16 and "t2v" in bf16["sidecars"]:
            ratio = bf16["sidecars"]["t2v"]["gpu_seconds"] / jobs["t2v"]["gpu_seconds"]
            lines.append(f"| FP8 vs BF16 clip, end to end | {ratio:.2f}x | (report) |")
        encode = t["media_encode"]
        lines.append(f"| MP4 encode of 189 frames 720p <= 3 s | {encode:.2f} s | {'yes' if encode <= 3 else 'no'} |")
    first = next(iter(jobs.values()), None)
    start = first["worker_start"] if first else None
    if start:
        ops = first["worker"]["ops"]
        if ops["source"] == "jit-build":  # the target's start has its ops built already
            lines.append(f"| warm worker start <= 20 s (Nano FP8) | not a warm start: {start['worker']:.1f} s, "
                         f"{ops['seconds']:.1f} s of it building the ops (JIT) | (not measured) |")
        else:
            lines.append(f"| warm worker start <= 20 s (Nano FP8) | {start['worker']:.1f} s (ops: {ops['source']}) | "
                         f"{'yes' if start['worker'] <= 20 else 'no'} |")
        waits = [w for w in (record["timings"].get("vae_wait") for record in jobs.values()) if w is not None]
        if waits:  # the VAE builds after ready(): what that costs the first job
            lines.append(f"| a job's wait for the VAE's background build | {max(waits):.1f} s | (report) |")
        lines.append(f"| checkpoint read >= 2 GB/s from local disk | {start['checkpoint_gb_per_s']:.2f} GB/s "
                     f"(page cache {farm['page_cache']}) | {'yes' if start['checkpoint_gb_per_s'] >= 2 else 'no'} |")
    for job, when in (("t2i", "a fresh worker's first still"), ("t2i-seed2", "the same prompt again"),
                      ("t2i-seed3", "and a third time")):
        if job in jobs:
            steps = jobs[job]["timings"]["steps"]
            lines.append(f"| T2I 1024x1024 50 steps FP8 <= 1.5 s of denoising ({when}: {_graph_note(jobs[job])}) | "
                         f"{sum(steps):.2f} s | {'yes' if sum(steps) <= 1.5 else 'no'} |")
    return lines + [""]


def _spread(values: list[float], digits: int = 3) -> str:
    """median / mean / 10th and 90th percentile / min / max of ``values``."""
    deciles = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else values * 9
    return " / ".join(f"{v:.{digits}f}" for v in (statistics.median(values), statistics.mean(values), deciles[0],
                                                  deciles[-1], min(values), max(values)))


def _graph_use(record: dict) -> str:
    """What a still's GEN passes ran on (sidecar ``cuda_graphs``): a still any of whose passes replayed a bucket's
    graph counts as a bucket's (the negative prompt's passes, in every job, earn graphs of its exact length)."""
    graphs = record.get("cuda_graphs")
    if not graphs:
        return "no graphs"
    if graphs["gen_captured"]:
        return "captured GEN graphs"
    return "replayed a bucket's graphs" if graphs["gen_bucket"] else "replayed exact-length graphs"


def _graph_note(record: dict) -> str:
    """A job's CUDA graphs in words (sidecar ``cuda_graphs``)."""
    g = record.get("cuda_graphs")
    if not g:
        return "no graphs"
    return (f"{g['gen_captured']} GEN graphs captured, GEN passes {g['gen_exact']} exact / {g['gen_bucket']} bucket, "
            f"UND passes {g['und_replayed']} replayed / {g['und_captured']} captured / {g['und_eager']} eager")


def clips_back_to_back(farm: dict) -> list[str]:
    """The clip and its second seed (``--jobs t2v,t2v-seed2``), one worker: the first started to the last published,
    and what that makes an hour."""
    clips = [farm["sidecars"][job] for job in ("t2v", "t2v-seed2") if job in farm["sidecars"]]
    if len(clips) < 2:
        return []
    span = max(record["finished"] for record in clips) - min(record["started"] for record in clips)
    return ["### Two clips back to back (T2V 1280x720, 189 frames, 35 steps)", "", "| figure | value |", "|---|---|",
            f"| first clip started to last one published | {span:.1f} s: {3600 * len(clips) / span:.1f} clips an hour "
            "on one GPU |", ""]


def stream_tables(farm: dict) -> list[str]:
    """The stream's stills (``--stills``): their denoising times, and which graphs they ran on."""
    stills = [record for job, record in farm["sidecars"].items() if job.startswith(STREAM_PREFIX)]
    if not stills:
        return []
    stills.sort(key=lambda record: record["started"])
    sums = [sum(record["timings"]["steps"]) for record in stills]
    span = stills[-1]["finished"] - stills[0]["started"]
    prompts = len({record["job"]["request"]["prompt"] for record in stills})
    lines = [f"### A stream of {len(stills)} stills over {prompts} prompts (T2I 1024x1024, 50 steps)", "",
             "| figure | value |", "|---|---|",
             f"| first still started to last one published | {span:.1f} s: {3600 * len(stills) / span:.0f} stills an "
             "hour on one GPU |",
             f"| denoising (steps sum) s: median / mean / p10 / p90 / min / max | {_spread(sums)} |",
             f"| stills with <= 1.5 s of denoising | {sum(t <= 1.5 for t in sums)} of {len(stills)} |"]
    for name, key in (("UND", "und"), ("VAE decode", "vae_decode"), ("pipeline total", "total"),
                      ("publish (PNG + hash + fsync)", "publish")):
        lines.append(f"| {name} s: median / mean / p10 / p90 / min / max | "
                     f"{_spread([record['timings'][key] for record in stills])} |")
    gpu_seconds = [record["gpu_seconds"] for record in stills if record["gpu_seconds"] is not None]  # none on CPUs
    if gpu_seconds:
        lines.append(f"| GPU-seconds a still: median / mean / p10 / p90 / min / max | {_spread(gpu_seconds)} |")
    telemetry = [record["gpu_telemetry"] for record in stills if (record.get("gpu_telemetry") or {}).get("samples")]
    if telemetry:
        lines.append(f"| SM clock MHz (a still's median): median over stills / lowest | "
                     f"{statistics.median(t['sm_clock_mhz_median'] for t in telemetry):.0f} / "
                     f"{min(t['sm_clock_mhz_min'] for t in telemetry):.0f} |")
        lines.append(f"| power W (a still's mean): median over stills; power-capped share of samples | "
                     f"{statistics.median(t['power_w_mean'] for t in telemetry):.0f}; "
                     f"{100 * statistics.mean(t['power_capped_share'] for t in telemetry):.0f}% |")
    reserved = [record["memory"]["peak_reserved_bytes"] for record in stills]
    if reserved[0] is not None:
        lines.append(f"| peak reserved GiB: first still / last still / most | {_gib(reserved[0])} / "
                     f"{_gib(reserved[-1])} / {_gib(max(reserved))} |")
    lines += ["", "| the still's GEN passes | stills | denoising s: median / mean / p10 / p90 / min / max |",
              "|---|---|---|"]
    by_use: dict[str, list[float]] = {}
    for record, seconds in zip(stills, sums, strict=True):
        by_use.setdefault(_graph_use(record), []).append(seconds)
    lines += [f"| {use} | {len(times)} | {_spread(times)} |" for use, times in sorted(by_use.items())]
    und = [record.get("cuda_graphs") or {} for record in stills]
    passes = sum(g.get("und_replayed", 0) + g.get("und_captured", 0) + g.get("und_eager", 0) for g in und)
    lines += ["", f"UND passes replayed from a graph: {sum(g.get('und_replayed', 0) for g in und)} of {passes} "
              "(a prompt length's pass is captured once it recurs within the recent passes).", "",
              "Denoising s of each still, in the order they ran:", "", "```"]
    lines += [" ".join(f"{t:.3f}" for t in sums[i:i + 10]) for i in range(0, len(sums), 10)]
    return lines + ["```", ""]


def native_steps(record: dict) -> list[float]:
    """Steps the published policy runs W8A8 (not its first and last three, which run W8A16)."""
    steps = record["timings"]["steps"]
    policy = record.get("step_policy") or {}
    first, last = policy.get("first_steps", 0) or 0, policy.get("last_steps", 0) or 0
    return steps[first: len(steps) - last] if len(steps) > first + last else steps


def direct_tables(r: dict) -> list[str]:
    load = r["load"]
    lines = ["### Pipeline alone (no Ray): worker start, T2I twice, a T2V latent decoded untiled and tiled", "",
             "| figure | value |", "|---|---|",
             f"| page cache | {load['page_cache']} |",
             f"| ops / allocate / attention kernels / checkpoint read / VAE / pipeline total s | {_s(load['ops'])} / "
             f"{_s(load['build'])} / {_s(load.get('attention_kernels'))} / {_s(load['checkpoint_read'])} / "
             f"{_s(load['vae'])} / {_s(load['total'])} |",
             f"| checkpoint read | {load['checkpoint_bytes'] / 1e9:.2f} GB at {_s(load['checkpoint_gb_per_s'])} GB/s |"]
    for i, job in enumerate(r["t2i"]):
        steps = job["timings"]["steps"]
        lines.append(f"| T2I job {i + 1}: VAE wait s / UND s / denoising (50 steps) s / steps median s | "
                     f"{_s(job['timings'].get('vae_wait'), 3)} / {job['timings']['und']:.3f} / {sum(steps):.3f} / "
                     f"{statistics.median(steps):.4f} |")
    for d in r["decodes"]:
        lines.append(f"| T2V decode ({d.get('decoder', 'diffusers')}, {'tiled' if d['tiled'] else 'untiled'}, "
                     f"{d.get('dtype', 'float32')}): s / "
                     "resident / peak allocated / peak "
                     f"reserved GiB | {d['seconds']:.2f} / {_gib(d['resident_bytes'])} / "
                     f"{_gib(d['peak_allocated_bytes'])} / {_gib(d['peak_reserved_bytes'])} |")
    return lines + [""]


def _cache_name(record: dict) -> str:
    cache = record.get("cache")
    return "off" if cache is None else f"{cache['method']}, threshold {cache['threshold']}"


def _clip_figures(record: dict) -> dict[str, float | str]:
    """A clip's sidecar as the step-cache table's rows."""
    t, cache = record["timings"], record.get("cache")
    steps = t["steps"]
    cached = set(cache["cached"]) if cache else set()
    edges = set((record.get("step_policy") or {}).get("a16_steps") or [])
    native = [s for i, s in enumerate(steps) if i not in cached and i not in edges]
    return {
        "step cache": _cache_name(record),
        "steps computed / cached": f"{len(steps) - len(cached)} / {len(cached)}",
        "cached steps": ", ".join(map(str, sorted(cached))) or "none",
        "denoising s": sum(steps),
        "computed W8A8 step, median s": statistics.median(native) if native else None,
        "W8A16 edge step, median s": statistics.median([steps[i] for i in edges]) if edges else None,
        "cached step, mean s": statistics.mean([steps[i] for i in cached]) if cached else None,
        "VAE decode s": t["vae_decode"],
        "MP4 encode s": t["media_encode"],
        "pipeline total s": t["total"],
        "job, render start to published s": record["finished"] - record["started"],
        "GPU-seconds": record["gpu_seconds"],
        "peak allocated during the steps GiB": (record["memory"]["stage_peak_allocated_bytes"] or {}).get("steps"),
    }


RATIO_ROWS = ("denoising s", "pipeline total s", "job, render start to published s")


def cache_table(runs: list[dict]) -> list[str]:
    """The clip (``t2v``) of an uncached farm run (``--cache off``) beside the same variant's cached runs, with the
    uncached / cached ratio of the times that caching shortens."""
    off = next((r for r in runs if r.get("cache") == "off" and "t2v" in r["sidecars"]), None)
    cached = [r for r in runs if r.get("cache") != "off" and "t2v" in r["sidecars"]
              and r["attention"] == (off or {}).get("attention")]
    if off is None or not cached:
        return []
    names = ["uncached (`--cache off`)"] + [f"`--cache {r['cache']}`" if r.get("cache") else "the default cache"
                                           for r in cached]
    return _side_by_side(f"### The clip through the farm, uncached and cached ({off['variant']}, attention "
                         f"{off['attention']})", names, [off, *cached], "uncached / cached")


def attention_table(runs: list[dict]) -> list[str]:
    """The clip of cached farm runs that differ in their attention choice (at the first one's cache setting),
    ``--attention fp8`` first, with its time over each other's."""
    clips = sorted((r for r in runs if r.get("cache") != "off" and "t2v" in r["sidecars"]),
                   key=lambda r: (r["attention"] != "fp8", r["attention"]))
    clips = [r for r in clips if r.get("cache") == clips[0].get("cache")] if clips else []
    if len({r["attention"] for r in clips}) < 2:
        return []
    names = [f"`--attention {r['attention']}`" for r in clips]
    return _side_by_side(f"### The clip through the farm by attention choice ({clips[0]['variant']})", names, clips,
                         f"{names[0]} / this")


def _side_by_side(title: str, names: list[str], runs: list[dict], ratio: str) -> list[str]:
    """Each run's clip figures in a column under ``names``, then the first run's time over each other's."""
    columns = [_clip_figures(r["sidecars"]["t2v"]) for r in runs]
    lines = [title, "", "| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for row in columns[0]:
        cells = [c[row] if isinstance(c[row], str) else
                 (_gib(c[row]) if row.endswith("GiB") else _s(c[row], 3 if "step" in row else 2)) for c in columns]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    for row in RATIO_ROWS:
        ratios = [f"{columns[0][row] / c[row]:.2f}x" for c in columns[1:]]
        lines.append(f"| {ratio}, {row.removesuffix(' s')} | | " + " | ".join(ratios) + " |")
    return lines + [""]


def rerender_table(farm: dict) -> list[str]:
    """``--rerenders N``: whether each job's media came out byte-identical from every render."""
    rerenders = farm.get("rerenders")
    if not rerenders:
        return []
    renders = rerenders["sha256"]
    exits = rerenders.get("exits", [])
    failed = [f"The re-renders' farm submit exited {exits}: a failed one proves nothing.", ""] if any(exits) else []
    lines = [f"### Forced re-renders: the first render and {len(renders) - 1} more with `--force`, a fresh worker each",
             "", *failed,
             "| job | media sha256 (first render) | byte-identical in all |", "|---|---|---|"]
    for job, same in rerenders["identical"].items():
        lines.append(f"| {job} | {(renders[0][job] or 'not published')[:16]} | {'yes' if same else 'NO'} |")
    return lines + [""]


def read_results(paths: list[str]) -> list[dict]:
    """This benchmark's results among ``paths``: a glob over an ``--out`` folder also matches the jobs' sidecars
    that ``farm`` copies there, which are skipped."""
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    results = [r for r in loaded if isinstance(r, dict) and r.get("kind") in KINDS]
    if not results:
        raise SystemExit(f"none of {len(paths)} files is a bench_render result (a JSON object whose 'kind' is one "
                         f"of {', '.join(KINDS)}); pass the files the write, farm, diffusers or direct step wrote")
    return results


def _first(runs: list[dict], **wanted) -> dict | None:
    """The first of ``runs`` whose fields have the ``wanted`` values (an absent field is None), or None."""
    return next((r for r in runs if all(r.get(k) == v for k, v in wanted.items())), None)


def do_report(args) -> None:
    results = read_results(args.results)
    by_kind = {}
    for r in results:  # a farm run is one per variant, cache setting and attention choice
        by_kind.setdefault((r["kind"], r.get("variant"), r.get("cache"), r.get("attention")), r)
    runs = list(by_kind.values())
    fp8 = [r for r in runs if (r["kind"], r.get("variant")) == ("farm", "fp8")]
    # the targets are the default cache's, at the attention the README's rows run where there is a choice
    farm = _first(fp8, cache=None, attention="fp8") or _first(fp8, cache=None) or next(iter(fp8), None)
    diffusers = _first(runs, kind="diffusers")
    bf16 = _first(runs, kind="farm", variant="bf16", cache=None)
    lines = [f"Machine: {results[0]['machine']}", ""]
    order = ("write", "farm", "diffusers", "direct")
    for key in sorted(by_kind, key=lambda k: (order.index(k[0]), k[1] != "fp8", str(k[1]), k[2] is not None,
                                              str(k[2]), k[3] != "fp8", str(k[3]))):
        r = by_kind[key]
        if r["kind"] == "write":
            lines += ["### Checkpoint written", "", "```", json.dumps(r["variants"], indent=1), "```", ""]
        elif r["kind"] == "farm":
            waited, compiled = r.get("waited_for_idle_gpu"), r.get("bytecode_compile_seconds")
            uncached = sorted({p for s in r["sidecars"].values() for p in s["worker"].get("uncached_bytecode", [])})
            lines += [f"`{r['command']}` ({r['variant']}, attention {r.get('attention')}, cache "
                      f"{r.get('cache') or 'the default'}): exit {r['exit']}, "
                      f"{r['seconds']:.1f} s, page cache {r['page_cache']}"
                      + ("" if waited is None else f", {waited:.1f} s waited for the GPU to be idle first")
                      + ("" if compiled is None else f", bytecode compiled first ({compiled:.1f} s)")
                      + (f"; the worker compiled {', '.join(uncached)} as it started" if uncached else ""), ""]
            for job, record in r["sidecars"].items():
                if not job.startswith(STREAM_PREFIX):
                    lines += job_table(job, record)
            lines += clips_back_to_back(r) + stream_tables(r) + rerender_table(r)
        elif r["kind"] == "direct":
            lines += direct_tables(r)
        else:
            steps = r["steps"]
            lines += ["### diffusers Cosmos3OmniPipeline, BF16, T2V 1280x720 189 frames, guidance 6", "",
                      "| figure | value |", "|---|---|",
                      f"| steps timed | {len(steps)} (the first includes tokenizing and set-up) |",
                      f"| per step s | {' / '.join(f'{s:.3f}' for s in steps)} |",
                      f"| load s | {r['load_seconds']:.1f} |",
                      f"| resident / peak allocated / peak reserved GiB | {_gib(r['resident_bytes'])} / "
                      f"{_gib(r['peak_allocated_bytes'])} / {_gib(r['peak_reserved_bytes'])} |", ""]
    lines += cache_table(fp8) + attention_table(fp8)
    if farm:
        lines += targets(farm, diffusers, bf16)
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write")
    write.add_argument("--root", type=Path, required=True)
    write.add_argument("--variants", nargs="+", default=["fp8", "bf16"])
    write.add_argument("--device", default="cuda")
    write.add_argument("--build", default="nano", choices=BUILD_NAMES, help="the published build whose files to write")
    write.add_argument("--link", nargs="*", default=[], choices=BUILD_NAMES,
                       help="more builds of the same shape, at ROOT/NAME, sharing the first variant's weights")
    farm = sub.add_parser("farm")
    farm.add_argument("--root", type=Path, required=True)
    farm.add_argument("--variant", default="fp8")
    farm.add_argument("--jobs", default="t2i,t2v,i2v", help="the workload's jobs (JOBS), comma-separated; may be empty")
    farm.add_argument("--stills", type=int, default=0, help="a stream of this many stills after them")
    farm.add_argument("--prompts", type=int, default=50, help="the stream's prompts (each with several seeds)")
    farm.add_argument("--attention", default="auto", choices=ATTENTION_CHOICES)
    farm.add_argument("--cache", choices=METHODS, help="the manifest's step cache (unset: the pipeline's default)")
    farm.add_argument("--drop-caches", action="store_true")
    farm.add_argument("--rerenders", type=int, default=0, help="render the manifest again this many times (--force, "
                                                               "a fresh worker each) and compare the media's bytes")
    farm.add_argument("--out", type=Path, required=True)
    diff = sub.add_parser("diffusers")
    diff.add_argument("--root", type=Path, required=True)
    diff.add_argument("--steps", type=int, default=3)
    diff.add_argument("--out", type=Path, required=True)
    direct = sub.add_parser("direct")
    direct.add_argument("--root", type=Path, required=True)
    direct.add_argument("--drop-caches", action="store_true")
    direct.add_argument("--no-decodes", action="store_true", help="worker start and the two stills only")
    direct.add_argument("--out", type=Path, required=True)
    report = sub.add_parser("report")
    report.add_argument("results", nargs="+")
    args = parser.parse_args()
    if args.command == "farm" and args.stills and args.prompts < 1:
        parser.error(f"--stills {args.stills} needs --prompts of at least 1 (got {args.prompts})")
    if args.command == "report":
        return do_report(args)
    out = getattr(args, "out", None) or args.root
    name = f"{args.command}-{run_tag(args.variant, args.cache) if args.command == 'farm' else 'all'}.json"
    if args.command == "farm" and (problem := _other_attention(out / name, args.attention)):
        parser.error(problem)
    result = KINDS[args.command](args)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out / name}")
    if args.command == "farm" and (failure := failed_submits(result)):
        raise SystemExit(failure)


KINDS = {"write": do_write, "farm": do_farm, "diffusers": do_diffusers, "direct": do_direct}  # a result's "kind"

if __name__ == "__main__":
    main()
