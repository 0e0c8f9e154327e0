"""Manifest v1: resolution of good manifests, and the corpus of bad ones in tests/farm/bad_manifests/.

Each bad manifest ends with `# expect: LINE: where: message` comments: exactly the errors it must produce,
in order (`{dir}` stands for the manifest's folder).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import ray

from cosmos3.rules.cache_options import DEFAULT_CACHE, cache_identity, hashed_cache
from cosmos3.rules.request import RequestRules, resolve
from farm import cli, fields, manifest
from farm.errors import ManifestError
from tests.farm.helpers import make_checkpoint, write_image, write_manifest

CORPUS = Path(__file__).parent / "bad_manifests"
BAD_MANIFESTS = [pytest.param(path, id=path.stem) for path in sorted(CORPUS.glob("*.yaml"))]
EXAMPLE = Path(__file__).parents[2] / "manifests" / "example.yaml"

DURATIONS = [
    pytest.param(45, 45.0, id="seconds"),
    pytest.param("90s", 90.0, id="90s"),
    pytest.param("30m", 1800.0, id="30m"),
    pytest.param("1h30m", 5400.0, id="1h30m"),
]


def _expected(path: Path, folder: Path) -> list[str]:
    return [line.removeprefix("# expect: ").replace("{dir}", str(folder))
            for line in path.read_text().splitlines() if line.startswith("# expect: ")]


@pytest.mark.parametrize("path", BAD_MANIFESTS)
def test_bad_manifest_is_rejected_with_every_error_and_nothing_written(path, tmp_path, capsys):
    folder = tmp_path / "manifests"
    shutil.copytree(CORPUS, folder)
    expected = [f"{path.name}:{line}" for line in _expected(path, folder)]
    assert expected, f"{path.name} has no '# expect:' lines"

    for command in ("validate", "plan", "submit"):
        assert cli.main([command, str(folder / path.name)]) == 1
        lines = capsys.readouterr().err.splitlines()
        assert lines[0] == f"error: {len(expected)} error{'s' if len(expected) > 1 else ''} in {path.name}"
        assert lines[1:] == expected
    assert not (folder / "out").exists()
    assert not ray.is_initialized()


def test_jobs_resolve_job_then_defaults_then_task_builtins(tmp_path):
    (tmp_path / "inputs").mkdir()
    write_image(tmp_path / "inputs" / "frame.png")
    jobs = [{"id": "clip", "prompt": "a", "seed": 7},
            {"id": "still", "task": "t2i", "prompt": "b", "priority": 10},
            {"id": "extend", "task": "i2v", "prompt": "c", "image": "inputs/frame.png", "steps": 20},
            {"id": "sweep", "prompt": "d", "seeds": [1, 2]}]
    m = manifest.load(write_manifest(tmp_path, jobs, defaults={"size": [1280, 720], "steps": 30, "frames": 121}))
    by_key = {job.key: job for job in m.jobs}

    requests = {key: job.request for key, job in by_key.items()}
    assert list(by_key) == ["clip", "still", "extend", "sweep@1", "sweep@2"]
    assert (requests["clip"].seed, requests["clip"].steps, requests["clip"].frames) == (7, 30, 121)
    # t2i: cosmos3's image defaults (guidance 7, one frame); the defaults' frames do not apply to a still.
    assert (requests["still"].frames, requests["still"].guidance, by_key["still"].priority) == (1, 7.0, 10)
    assert requests["extend"].image == str(tmp_path / "inputs" / "frame.png") and requests["extend"].steps == 20
    assert (requests["sweep@2"].seed, requests["sweep@2"].video) == (2, None)
    assert by_key["sweep@2"].media == str(tmp_path / "out" / "test" / "sweep_s2.mp4")
    assert by_key["still"].media.endswith("still_s0.png")


def test_config_hash_follows_the_pixels_not_the_scheduling(tmp_path):
    base = {"id": "a", "prompt": "a red circle"}

    def hash_of(job: dict, **kwargs) -> str:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        return manifest.load(write_manifest(folder, [job], **kwargs)).jobs[0].config_hash

    original = hash_of(base)
    assert hash_of({**base, "priority": 5, "retries": 0, "timeout": "1h"}) == original
    assert hash_of({**base, "prompt": "a blue circle"}) != original
    assert hash_of({**base, "seed": 1}) != original
    assert hash_of(base, model={"precision": "bf16"}) != original
    # A cached render is another render; the default spelled out is the default.
    assert hash_of(base, model={"cache": "seacache"}) == original
    assert hash_of(base, model={"cache": "off"}) != original
    assert hash_of(base, model={"cache": {"method": "seacache", "threshold": 0.4}}) != original
    # Stills run the cache too: each setting is another PNG.
    still = {**base, "task": "t2i"}
    settings = ("seacache", "off", {"method": "seacache", "threshold": 0.4})
    assert len({hash_of(still, model={"cache": cache}) for cache in settings}) == 3
    assert hash_of(still, model={"precision": "bf16"}) != hash_of(still)


def test_a_stills_cache_is_hashed_apart_from_the_default_uncached_stills_hashed():
    """Stills once ran every step and hashed DEFAULT_CACHE whatever their manifest said; now that they run the cache,
    no setting of theirs hashes as that did, so a still rendered uncached is not done."""
    settings = (DEFAULT_CACHE, "off", {"method": "seacache", "threshold": 0.4})
    assert all(hashed_cache(cache, 1) != cache_identity(DEFAULT_CACHE) for cache in settings)
    # clips hash their identity, as before
    assert [hashed_cache(cache, 5) for cache in settings] == [cache_identity(cache) for cache in settings]


# The settings Cosmos3's recipes publish, written out as a user copies them from diffusers' SeaCacheConfig.
PUBLISHED_CACHE = {"method": "seacache", "threshold": 0.25, "max_consecutive": 2, "retention_steps": 1,
                   "end_steps": 1, "residual_order": 1, "power_exp": 3.0}


@pytest.mark.parametrize("same, other", [
    pytest.param(["seacache", {"method": "seacache"}, PUBLISHED_CACHE, {**PUBLISHED_CACHE, "power_exp": 3}],
                 {"method": "seacache", "threshold": 0.4}, id="the published settings"),
    pytest.param([{"method": "seacache", "threshold": 0.4}, {"method": "seacache", "threshold": 0.4, "end_steps": 1},
                  {**PUBLISHED_CACHE, "threshold": 0.4}], "seacache", id="a threshold of its own"),
    pytest.param(["off", False], "seacache", id="off"),
    pytest.param([{"method": "seacache", "residual_order": z} for z in (0, 0.0, -0.0)], "seacache",
                 id="a residual order of zero"),
    pytest.param([{"method": "seacache", "threshold": z} for z in (0, 0.0, -0.0)], "seacache",
                 id="a threshold of zero"),
])
def test_one_cache_setting_hashes_the_same_however_it_is_written(tmp_path, same, other):
    def hash_of(cache) -> str:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        path = write_manifest(folder, [{"id": "a", "prompt": "x"}], model={"cache": cache})
        return manifest.load(path).jobs[0].config_hash

    hashes = {hash_of(cache) for cache in same}
    assert len(hashes) == 1 and hash_of(other) not in hashes


def test_sound_follows_the_checkpoint_and_a_wav_sits_beside_its_mp4(tmp_path):
    jobs = [{"id": "clip", "prompt": "a", "outputs": ["mp4", "wav"]}, {"id": "silent", "prompt": "b", "sound": False},
            {"id": "still", "task": "t2i", "prompt": "c"}]
    clip, silent, still = manifest.load(write_manifest(tmp_path, jobs, sound=True)).jobs
    assert (clip.request.sound, silent.request.sound, still.request.sound) == (True, False, False)
    assert clip.wav == str(tmp_path / "out" / "test" / "clip_s0.wav") and clip.files == (clip.media, clip.wav)
    assert (silent.wav, still.wav, still.files) == (None, None, (still.media,))


def test_defaults_outputs_apply_to_clips_and_leave_stills_one_png(tmp_path):
    jobs = [{"id": "clip", "prompt": "a"}, {"id": "still", "task": "t2i", "prompt": "b"}]
    clip, still = manifest.load(write_manifest(tmp_path, jobs, sound=True, defaults={"outputs": ["mp4", "wav"]})).jobs
    assert clip.wav is not None and still.files == (still.media,)


def test_a_wav_of_a_clip_whose_sound_is_off_is_refused(tmp_path):
    jobs = [{"id": "clip", "prompt": "a", "sound": False, "outputs": ["mp4", "wav"]}]
    with pytest.raises(ManifestError, match=r"outputs: wav is the clip's sound, and this job renders none "
                                            r"\(sound is false\); drop wav from outputs"):
        manifest.load(write_manifest(tmp_path, jobs, sound=True))


def test_config_hash_follows_sound_and_the_files_published(tmp_path):
    def hash_of(job: dict) -> str:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        return manifest.load(write_manifest(folder, [job], sound=True)).jobs[0].config_hash

    base = {"id": "a", "prompt": "a red circle"}
    original = hash_of(base)
    assert hash_of({**base, "sound": True}) == original  # unset already means on, on this checkpoint
    assert hash_of({**base, "sound": False}) != original
    assert hash_of({**base, "outputs": ["mp4", "wav"]}) != original  # a done MP4 alone is not a done MP4 + WAV


def test_config_hash_changes_when_the_checkpoint_config_changes(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    before = manifest.load(path).jobs[0].config_hash
    make_checkpoint(tmp_path / "ckpt", static_fp8=True)
    assert manifest.load(path).jobs[0].config_hash != before


def test_static_fp8_checkpoint_is_recognised_and_runs_unsharded(tmp_path):
    make_checkpoint(tmp_path / "ckpt-fp8", static_fp8=True)
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}], model={"checkpoint": "ckpt-fp8"})
    assert manifest.load(path).model.static_fp8


def test_bare_off_means_step_precision_off(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    path.write_text(path.read_text().replace("checkpoint: ckpt", "checkpoint: ckpt\n  step_precision: off"))
    assert manifest.load(path).model.options.step_precision == "off"


@pytest.mark.parametrize("value, seconds", DURATIONS)
def test_timeouts_read_as_seconds(value, seconds):
    assert fields.timeout(value) == seconds


def test_a_jobs_request_is_what_the_worker_resolves_it_to(tmp_path):
    """Every value is concrete, so the worker's cosmos3.rules.request.resolve finds nothing to fill in or refuse."""
    jobs = [{"id": "a", "prompt": "x"}, {"id": "b", "task": "t2i", "prompt": "y", "guidance": 3}]
    m = manifest.load(write_manifest(tmp_path, jobs))
    rules = RequestRules.from_checkpoint(m.model.checkpoint)
    for job in m.jobs:
        assert resolve(job.request, rules).request() == job.request
        assert None not in (job.request.width, job.request.frames, job.request.steps, job.request.guidance)


def test_example_manifest_is_valid_but_for_the_cluster_files_it_names():
    with pytest.raises(ManifestError) as caught:
        manifest.load(EXAMPLE)
    problems = caught.value.problems
    # Without a checkpoint there are no request rules to check the jobs by (its i2v input is missing too).
    assert problems[0].where == "model -> checkpoint" and "is not a directory" in problems[0].message
    # /mnt/renders/harbour-city is missing here: refused only where /mnt cannot be written (test_run_faults
    # checks a read-only root).
    assert all(p.where == "output -> root" and "is the share mounted?" in p.message for p in problems[1:])


def distilled(folder: Path) -> None:
    """Give the checkpoint beside a manifest a distilled 4-step scheduler config."""
    config = {"_class_name": "FlowMatchEulerDiscreteScheduler", "stochastic_sampling": True,
              "fixed_step_sampler_config": {"t_list": [1.0, 0.9, 0.7, 0.3], "sample_type": "sde"}}
    make_checkpoint(folder / "ckpt", scheduler=config)


def test_distilled_checkpoint_jobs_take_its_fixed_schedule(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}, {"id": "b", "task": "t2i", "prompt": "y"}])
    distilled(tmp_path)
    jobs = manifest.load(path).jobs
    assert [(j.request.steps, j.request.guidance) for j in jobs] == [(4, 1.0), (4, 1.0)]


def test_distilled_checkpoint_refuses_other_steps_guidance_and_negative_prompts(tmp_path):
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x", "steps": 35, "guidance": 6.0,
                                      "negative_prompt": "blurry"}])
    distilled(tmp_path)
    with pytest.raises(ManifestError) as err:
        manifest.load(path)
    message = str(err.value)
    assert "steps: this distilled checkpoint runs its fixed 4-step schedule, got 35" in message
    assert "guidance: this distilled checkpoint has guidance baked in (1.0), got 6.0" in message
    assert "negative_prompt: a distilled checkpoint runs no unconditional pass; leave it empty" in message


@pytest.mark.parametrize("precision", ["bf16", "fp8-dynamic"])
def test_forcing_another_precision_on_a_static_fp8_checkpoint_is_refused(tmp_path, precision):
    make_checkpoint(tmp_path / "ckpt-fp8", static_fp8=True)
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}],
                          model={"checkpoint": "ckpt-fp8", "precision": precision})
    with pytest.raises(ManifestError, match=f"'{precision}' on a ModelOpt static FP8 checkpoint would re-quantize"):
        manifest.load(path)


# -- checkpoint damage the headers show: refused at validate with the loader's own message -------

WEIGHTS = "diffusion_pytorch_model.safetensors"


def _truncated(transformer: Path) -> None:
    data = (transformer / WEIGHTS).read_bytes()
    (transformer / WEIGHTS).write_bytes(data[:-10])


def _garbage_header(transformer: Path) -> None:
    data = bytearray((transformer / WEIGHTS).read_bytes())
    data[8:24] = b"\x00garbage header\xff"
    (transformer / WEIGHTS).write_bytes(bytes(data))


def _missing_shard(transformer: Path) -> None:
    index = {"weight_map": {"norm_moe_gen.weight": "diffusion_pytorch_model-00002-of-00002.safetensors"}}
    (transformer / f"{WEIGHTS}.index.json").write_text(json.dumps(index))


def _config(**fields):
    """Edits the config.json of the folder it is given (transformer/ or vae/)."""
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return edit


@pytest.mark.parametrize("damage,message", [
    pytest.param(_truncated, "truncated", id="truncated-shard"),
    pytest.param(_garbage_header, "the safetensors header is not JSON", id="garbage-header"),
    pytest.param(_missing_shard, "shard files listed but not present", id="missing-shard"),
    pytest.param(_config(hidden_size="192"), "hidden_size must be an integer, got '192'", id="hidden-size-string"),
    pytest.param(_config(quantization_config="fp8"), "quantization_config must be an object", id="quant-config-string"),
])
def test_checkpoint_damage_is_refused_at_validate_with_the_loaders_message(tmp_path, capsys, damage, message):
    from cosmos3 import load_transformer
    from cosmos3.errors import Cosmos3Error

    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    damage(tmp_path / "ckpt" / "transformer")
    with pytest.raises(Cosmos3Error, match=message) as at_load:
        load_transformer(tmp_path / "ckpt")
    assert cli.main(["validate", str(path)]) == 1
    assert f"model -> checkpoint: {at_load.value}" in capsys.readouterr().err  # names the file and the field


# -- a component a worker loads, missing or broken (issue 49): refused at validate with the worker's own check ----

def _remove(name: str):
    def remove(root: Path) -> None:
        shutil.rmtree(root / name) if (root / name).is_dir() else (root / name).unlink()
    return remove


def _broken_tokenizer_json(root: Path) -> None:
    (root / "text_tokenizer" / "tokenizer.json").write_text('{"version": "1.0", "model": ')


@pytest.mark.parametrize("damage,component,message", [
    pytest.param(_remove("text_tokenizer"), None, "missing text_tokenizer", id="no-text-tokenizer"),
    pytest.param(_remove("model_index.json"), None, "missing model_index.json", id="no-model-index"),
    pytest.param(_broken_tokenizer_json, "text_tokenizer", "the text tokenizer did not load", id="broken-tokenizer"),
    pytest.param(_remove("text_tokenizer/tokenizer.json"), "text_tokenizer", "the text tokenizer did not load",
                 id="no-tokenizer-json"),
    pytest.param(_remove("text_tokenizer/tokenizer_config.json"), "text_tokenizer", "no tokenizer_config.json",
                 id="no-tokenizer-config"),
])
def test_a_component_the_worker_loads_is_checked_at_validate(tmp_path, capsys, damage, component, message):
    from cosmos3.errors import Cosmos3Error
    from cosmos3.prompt_tokenizer import PromptTokenizer
    from cosmos3.rules.checkpoint_header import check_layout

    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    root = tmp_path / "ckpt"
    damage(root)
    # What Cosmos3Pipeline.from_pretrained runs first: the layout, then the text tokenizer's load.
    with pytest.raises(Cosmos3Error, match=message) as at_start:
        check_layout(root) if component is None else PromptTokenizer.from_pretrained(root / component)
    assert cli.main(["validate", str(path)]) == 1
    assert f"model -> checkpoint: {at_start.value}" in capsys.readouterr().err


# -- a vae/ a worker could not start with: refused at validate with the worker's own start check ---------------

@pytest.mark.parametrize("damage,message", [
    pytest.param(_truncated, "truncated", id="truncated-weights"),
    pytest.param(lambda vae: (vae / WEIGHTS).unlink(), "no diffusion_pytorch_model.safetensors", id="no-weights"),
    pytest.param(_config(z_dim=8, latents_mean=[0.0] * 8, latents_std=[1.0] * 8),
                 "transformer latent_channel=4 does not match vae z_dim=8", id="z-dim"),
    pytest.param(_config(latents_std=[1.0]), "latents_mean and latents_std need z_dim=4 entries", id="stats"),
])
def test_vae_damage_is_refused_at_validate_with_the_workers_start_message(tmp_path, capsys, damage, message):
    from cosmos3.errors import Cosmos3Error
    from cosmos3.rules.checkpoint_header import check_vae_dir

    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    damage(tmp_path / "ckpt" / "vae")
    with pytest.raises(Cosmos3Error, match=message) as at_start:  # what a worker's pipeline runs before it loads
        check_vae_dir(tmp_path / "ckpt" / "vae", latent_channel=4)
    assert cli.main(["validate", str(path)]) == 1
    assert f"model -> checkpoint: {at_start.value}" in capsys.readouterr().err


def test_exponent_numbers_read_as_yaml_1_2_reads_them(tmp_path):
    """YAML 1.1 reads `6.5e0` and `1e1` as strings; every user means the number."""
    path = write_manifest(tmp_path, [{"id": "a", "prompt": "x"}])
    path.write_text(path.read_text().replace("prompt: x", "prompt: x\n  guidance: 6.5e0\n  fps: 1e1"))
    request = manifest.load(path).jobs[0].request
    assert (request.guidance, request.fps) == (6.5, 10.0)


@pytest.mark.parametrize("task,field,content", [
    pytest.param("i2v", "image", b"this is text, not a PNG\n", id="text-as-image"),
    pytest.param("v2v", "video", b"this is text, not an MP4\n", id="text-as-video"),
])
def test_a_conditioning_input_whose_header_does_not_decode_is_refused_at_validate(tmp_path, task, field, content):
    """Named like media, but not: refused at validate with the path and the decoder's reason, not at render."""
    name = f"input.{'png' if field == 'image' else 'mp4'}"
    (tmp_path / name).write_bytes(content)
    path = write_manifest(tmp_path, [{"id": "a", "task": task, "prompt": "x", field: name, "frames": 9}])
    with pytest.raises(ManifestError, match=rf"{field}: cannot read {tmp_path / name} as an? {field} \(.+\)"):
        manifest.load(path)
