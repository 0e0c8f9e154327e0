"""The six published builds at tiny Super shape: each driven by its own files (step policy, scheduler, model card),
`farm validate` and the worker's pipeline refusing the same requests with the same words."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks.common import BUILD_NAMES
from benchmarks.random_checkpoint import BUILDS, link_build, write_checkpoint
from cosmos3.errors import PipelineError
from cosmos3.pipeline import Cosmos3Pipeline, RenderRequest
from cosmos3.rules.request import RequestRules
from farm import manifest
from farm.errors import ManifestError
from tests.benchmarks.test_random_checkpoint import TINY_SUPER, VAE

# What each build's files say (docs/models.md, "The six builds").
EXPECTED = {
    "super": (True, False, ("t2v", "t2i", "i2v", "v2v")),
    "super-i2v": (True, False, ("t2v", "t2i", "i2v", "v2v")),
    "super-t2i": (False, False, ("t2i",)),
    "super-t2i-4step": (False, True, ("t2i",)),
    "super-i2v-4step": (False, True, ("t2v", "t2i", "i2v", "v2v")),
}
LINKED = [name for name in EXPECTED if name != "super"]


def tiny(name: str):
    return dataclasses.replace(BUILDS[name], transformer=TINY_SUPER)


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("builds")
    write_checkpoint(base / "super", variant="fp8", vae=VAE, build=tiny("super"), shard_bytes=30_000)
    for name in LINKED:
        link_build(base / "super", base / name, tiny(name))
    return {name: base / name for name in EXPECTED}


def test_every_build_is_named_where_the_benchmarks_parse_without_torch():
    assert tuple(BUILDS) == BUILD_NAMES


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_build_reads_its_policy_recipe_and_tasks_from_its_files(roots, name):
    policy, distilled, tasks = EXPECTED[name]
    root = roots[name]
    quant = json.loads((root / "transformer" / "config.json").read_text())["quantization_config"]
    assert ("runtime" in quant) is policy
    rules = RequestRules.from_checkpoint(root)
    assert rules.recipe.is_distilled is distilled and rules.tasks == tasks
    if distilled:  # the list diffusers reads (modular_model_index.json) is the scheduler's own
        modular = json.loads((root / "modular_model_index.json").read_text())
        assert modular == {"is_distilled": True, "distilled_sigmas": list(rules.recipe.fixed_sigmas)}
    pipe = Cosmos3Pipeline.from_pretrained(root)
    assert pipe.model.precision == "fp8-static"
    assert (pipe.model.step_policy_info() is not None) is policy


def test_linked_builds_share_the_weights_and_keep_their_own_configs(roots):
    shards = sorted((roots["super"] / "transformer").glob("*.safetensors"))
    assert len(shards) > 1
    for name in LINKED:
        for shard in shards:
            assert (roots[name] / "transformer" / shard.name).stat().st_ino == shard.stat().st_ino
        assert (roots[name] / "transformer" / "config.json").stat().st_ino != \
            (roots["super"] / "transformer" / "config.json").stat().st_ino
    # Writing a build's config left the source's alone: its policy is still there.
    assert "runtime" in json.loads((roots["super"] / "transformer" / "config.json").read_text())["quantization_config"]


REFUSED = [
    pytest.param("super-t2i", {"task": "t2v", "frames": 5}, "task",
                 "this checkpoint renders t2i only (its README.md says pipeline_tag: text-to-image), so task t2v is "
                 "refused; use task t2i, or a video build", id="image-only-t2v"),
    pytest.param("super-t2i-4step", {"task": "i2v", "frames": 5, "image": "frame.png"}, "task",
                 "so task i2v is refused", id="image-only-4step-i2v"),
    pytest.param("super-t2i-4step", {"task": "t2i", "steps": 50}, "steps",
                 "this distilled checkpoint runs its fixed 4-step schedule, got 50", id="4step-steps"),
    pytest.param("super-i2v-4step", {"task": "t2v", "frames": 5, "guidance": 6.0}, "guidance",
                 "this distilled checkpoint has guidance baked in (1.0), got 6.0", id="4step-guidance"),
]


@pytest.mark.parametrize("name,fields,field,message", REFUSED)
def test_farm_validate_and_the_worker_refuse_the_same_request_naming_the_field(roots, tmp_path, name, fields, field,
                                                                              message):
    if "image" in fields:
        from PIL import Image

        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "frame.png")
    job = {"id": "j", "prompt": "a red robot", "size": [32, 32], **fields}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "m", "model": {"checkpoint": str(roots[name])},
                                    "output": {"root": str(tmp_path / "out")}, "jobs": [job]}))
    with pytest.raises(ManifestError) as caught:
        manifest.load(path)
    assert f"{field}: " in str(caught.value) and message in str(caught.value)

    request = {k: v for k, v in fields.items() if k != "image"}
    image = str(tmp_path / "frame.png") if "image" in fields else None
    with pytest.raises(PipelineError) as refused:
        Cosmos3Pipeline.from_pretrained(roots[name])(
            RenderRequest(prompt="a red robot", width=32, height=32, image=image, **request))
    assert f"{field}: " in str(refused.value) and message in str(refused.value)


@pytest.mark.parametrize("name", ["super-t2i", "super-t2i-4step"])
def test_an_image_only_build_renders_its_stills(roots, name):
    request = RenderRequest(task="t2i", prompt="a red robot", width=32, height=32,
                            steps=None if "4step" in name else 2)
    out = Cosmos3Pipeline.from_pretrained(roots[name])(request)
    assert out.frames.shape == (1, 32, 32, 3) and out.info["steps"] == (4 if "4step" in name else 2)


# The jobs benchmarks/super_one_gpu.sh asks of each build through bench_render's manifest.
SCRIPT_RUNS = [("super", ["t2i", "t2i-seed2", "t2v"]), ("super", ["t2i", "t2i-seed2", "t2v-short"]),
               ("super-t2i", ["t2i", "t2i-seed2"]), ("super-t2i-4step", ["t2i-4step"]),
               ("super-i2v-4step", ["i2v-4step"])]


@pytest.mark.parametrize("name,jobs", SCRIPT_RUNS)
def test_the_super_scripts_manifests_validate_against_their_builds(roots, tmp_path, name, jobs):
    from benchmarks.bench_render import workload_jobs, write_manifest
    from farm import memory

    loaded = manifest.load(write_manifest(tmp_path / "run", roots[name], name, workload_jobs(jobs)))
    assert sorted(job.key for job in loaded.jobs) == sorted(jobs)
    distilled = {job.key: job.request.steps for job in loaded.jobs if "4step" in job.key}
    assert all(steps == 4 for steps in distilled.values())
    planned = memory.plan_manifest(loaded)  # farm plan's figures for the script's manifests
    assert set(planned.jobs) == set(jobs) and all(job.need > 0 for job in planned.jobs.values())
