"""Shared by farm and worker tests: a checkpoint folder the manifest can read, manifests, output checks, Ray."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import yaml

from farm import storage
from toy.layout import PROMPT_WORDS, write_pipeline_files, write_tokenizer

STATIC_FP8_QUANT = {
    "quant_method": "modelopt", "quant_algo": "FP8", "quant_type": "FP8_FP8", "weight_only": False,
    "config_groups": {"group_0": {"weights": {"dynamic": False, "num_bits": 8, "type": "float"},
                                  "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                                  "targets": ["Linear"]}},
}


TEXT_VOCAB = 151_936  # the transformer config's vocab_size (the published default)
# The transformer's config: its latents are the VAE's (latent_channel = z_dim, patch_latent_dim = z_dim * 2 * 2).
TRANSFORMER = {"_class_name": "Cosmos3OmniTransformer", "hidden_size": 32, "latent_channel": 4, "patch_latent_dim": 16}
UNIPC = {"_class_name": "UniPCMultistepScheduler", "prediction_type": "flow_prediction", "use_flow_sigmas": True}
VAE = {"_class_name": "AutoencoderKLWan", "z_dim": 4, "latents_mean": [0.0, 0.1, -0.1, 0.2],
       "latents_std": [1.0, 0.9, 1.1, 0.8], "scale_factor_spatial": 16, "scale_factor_temporal": 4}
# A sound tokenizer's config: 8 kHz over a 320-sample hop, stereo (what sizes a clip's sound).
SOUND_TOKENIZER = {"_class_name": "Cosmos3AVAEAudioTokenizer", "sampling_rate": 8000, "vocoder_input_dim": 8,
                   "dec_strides": [4, 8, 10], "dec_out_channels": 2}


def make_checkpoint(root: Path, *, static_fp8: bool = False, scheduler: dict = UNIPC, sound: bool = False) -> Path:
    """Just enough of the published layout for the driver and the fake pipelines, which load no weights: every
    component a worker loads (model_index.json, the text tokenizer), the configs cosmos3 checks requests and
    load options against (transformer, scheduler, VAE, sound tokenizer) and whole safetensors files, which
    validation reads the headers of."""
    config: dict[str, Any] = dict(TRANSFORMER)
    if static_fp8:
        config["quantization_config"] = STATIC_FP8_QUANT
    files = [("transformer/config.json", config), ("vae/config.json", VAE)]
    if sound:
        config.update(sound_gen=True, sound_dim=SOUND_TOKENIZER["vocoder_input_dim"])
        files.append(("sound_tokenizer/config.json", SOUND_TOKENIZER))
    write_pipeline_files(root, scheduler, sound=sound)  # model_index.json and scheduler/
    write_tokenizer(root / "text_tokenizer", PROMPT_WORDS, vocab_size=TEXT_VOCAB)
    for path, data in files:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(json.dumps(data))
    write_weights(root / "transformer", static_fp8=static_fp8)
    for decoder in ("vae", "sound_tokenizer") if sound else ("vae",):
        write_decoder_weights(root / decoder)
    return root


def write_decoder_weights(directory: Path) -> Path:
    """A whole safetensors file where the VAE's (or sound tokenizer's) weights go: validation reads its header,
    no fake loads it."""
    import torch
    from safetensors.torch import save_file

    save_file({"decoder.conv_out.bias": torch.zeros(3)}, directory / "diffusion_pytorch_model.safetensors")
    return directory


def write_weights(directory: Path, *, static_fp8: bool) -> Path:
    """One shard of stand-in tensors: a norm, and for static FP8 one e4m3 projection with its per-tensor scales."""
    import torch
    from safetensors.torch import save_file

    tensors = {"norm_moe_gen.weight": torch.ones(32, dtype=torch.bfloat16)}
    if static_fp8:
        tensors |= {"layers.0.self_attn.to_q.weight": torch.zeros(32, 32).to(torch.float8_e4m3fn),
                    "layers.0.self_attn.to_q.weight_scale": torch.tensor(0.01),
                    "layers.0.self_attn.to_q.input_scale": torch.tensor(0.02)}
    for old in directory.glob("*.safetensors"):
        old.unlink()
    save_file(tensors, directory / "diffusion_pytorch_model.safetensors")
    return directory


def scale_one_tensor_in_place(shard: Path) -> None:
    """Doubles the first bf16 value of a shard's data (1.0 -> 2.0), or halves it back: same size, same header, same
    inode (a fine-tune written in place, and its rollback)."""
    data = bytearray(shard.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # safetensors: u64 header length, header, data
    one, two = bytes.fromhex("803f"), bytes.fromhex("0040")  # bf16 1.0 and 2.0, little-endian
    assert data[start:start + 2] in (one, two)
    data[start:start + 2] = two if data[start:start + 2] == one else one
    with open(shard, "r+b") as handle:
        handle.write(data)


def write_image(path: Path) -> Path:
    """A small real PNG: validation decodes an I2V input's header."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 16), (200, 30, 30)).save(path)
    return path


def write_video(path: Path) -> Path:
    """A short real MP4: validation reads a V2V input's header."""
    import imageio.v3 as iio
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, np.zeros((9, 32, 32, 3), np.uint8), fps=8)
    return path


def write_manifest(folder: Path, jobs: list[dict], *, name: str = "test", defaults: dict | None = None,
                   model: dict | None = None, output: dict | None = None, sound: bool = False) -> Path:
    """A small, fast manifest in `folder` (tiny frames, few steps) with a checkpoint beside it (`sound`: one
    that generates sound)."""
    make_checkpoint(folder / "ckpt", sound=sound)
    doc = {
        "version": 1, "name": name,
        "model": {"checkpoint": "ckpt", **(model or {})},
        "output": {"root": "out", **(output or {})},
        "defaults": {"size": [32, 32], "frames": 5, "fps": 8, "steps": 4, "retries": 2, **(defaults or {})},
        "jobs": jobs,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def publish(job, *, run: str, attempt: int = 1, data: bytes = b"video bytes") -> None:
    """Publishes `job` the way a worker does, with made-up media bytes."""
    media = storage.publish(Path(job.media), lambda out: out.write(data))
    storage.write_json(storage.sidecar_path(job.media), storage.sidecar_record(job, run, attempt, media))


def output_files(root: Path) -> list[str]:
    """Every file under an output root except the farm's own records, relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".farm" not in p.parts)


def wait_while_running(condition, run: subprocess.Popen, what: str, seconds: float = 120) -> None:
    """Returns once `condition()` holds; fails if `run` (a `farm submit` with its stderr piped) ends first, with
    its stderr's tail, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert run.poll() is None, f"{what} did not happen: the run ended\n{run.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:g}s"
        time.sleep(0.1)


def assert_every_job_done_once(root: Path, jobs: list[dict]) -> None:
    """Each job of a manifest written by `write_manifest` (one seed each) is done: its media and sidecar, nothing
    else, no temp file."""
    assert {entry["state"] for entry in state(root)["jobs"].values()} == {"done"}
    media = sorted(f"test/{job['id']}_s0.mp4" for job in jobs)
    assert output_files(root) == sorted(media + [m + ".json" for m in media]) and not temp_files(root)


def temp_files(root: Path) -> list[str]:
    return [name for name in output_files(root) if Path(name).name.endswith(".tmp")]


def events(root: Path, name: str = "test") -> list[dict]:
    path = root / ".farm" / name / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def started_on(root: Path, node_id: str) -> list[str]:
    """Keys of the jobs whose attempts started on node `node_id`, in order (none before the event log exists)."""
    if not (root / ".farm" / "test" / "events.jsonl").exists():
        return []
    return [e["key"] for e in events(root) if e["event"] == "job_started" and e["node"] == node_id]


def state(root: Path, name: str = "test") -> dict:
    return json.loads((root / ".farm" / name / "state.json").read_text())


@contextlib.contextmanager
def local_cluster(**options: Any) -> Iterator[None]:
    """One Ray cluster for a test module: starting one costs seconds, so modules share it. `options` go to
    ray.init (resources; include_dashboard=True where a test reads the state API)."""
    ray.init(**{"address": "local", "include_dashboard": False, **options})  # never another test run's cluster
    try:
        yield
    finally:
        ray.shutdown()


def render_and_publish(worker, job, attempt: int = 1) -> dict:
    """An attempt as the driver runs it on a RenderWorker actor: its render, then its publish's summary."""
    ray.get(worker.render.remote(job, attempt))
    return ray.get(worker.publish.remote(job, attempt))
