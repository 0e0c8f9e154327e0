"""`farm validate` refuses exactly what a worker's cosmos3 would, in cosmos3's words, at the
job's YAML line.

For every variant, the expectation is computed independently of the manifest code: the job as the
worker's `cosmos3.rules.request.problems` sees it (YAML `size: [w, h]` is width and height, paths resolve against
the manifest's folder, a job without a task is t2v). The manifest must accept exactly the variants cosmos3
accepts and, for each (field, message) cosmos3 reports, print a line ending in `field: message` at the YAML
key holding that field, and nothing else.
"""

from __future__ import annotations

import json

import pytest
import yaml

from cosmos3.rules import load_options
from cosmos3.rules.config import Cosmos3Config
from cosmos3.rules.load_options import LoadOptions
from cosmos3.rules.request import RenderRequest, RequestRules, problems
from farm import manifest
from farm.errors import ManifestError
from tests.farm.helpers import make_checkpoint, write_image, write_video

DISTILLED = {"_class_name": "FlowMatchEulerDiscreteScheduler", "stochastic_sampling": True,
             "fixed_step_sampler_config": {"t_list": [1.0, 0.9, 0.7, 0.3], "sample_type": "sde"}}
NAN, INF = float("nan"), float("inf")


def _bounds(field: str, good: list, bad: list) -> list:
    return ([pytest.param({field: v}, id=f"{field}={v!r}") for v in good]
            + [pytest.param({field: v}, id=f"{field}={v!r}(bad)") for v in bad])


JOBS = [
    *_bounds("size", [[16, 16], [1280, 720], [2048, 16], [4096, 16]],
             [[0, 16], [-16, 16], [40, 32], [32, 20], [17.5, 16], ["32", 16], [True, 16], [40, 20], [4112, 16],
              [1 << 20, 1 << 20]]),
    *_bounds("frames", [1, 5, 189, 509], [0, -3, 6, 100, 2.0, "9", True, 513, 4_000_000_001]),
    *_bounds("fps", [1, 24, 120], [0, -1, INF, NAN, "24", False, 0.001, 120.5, 1e6, 1e-7, 10**400]),
    *_bounds("steps", [1, 50, 1000], [0, -1, 2.5, True, "35", 1001, 10**12]),
    *_bounds("guidance", [0, 6.5, 20], [-0.1, NAN, INF, -INF, "6", 20.5, 100, 1e38, 1e308, 10**400]),
    *_bounds("seed", [0, 2**63 - 1], [2**63, -1, 1.5, True, "7", 10**400]),
    *_bounds("prompt", ["x", "a red circle " * 1300], ["", "   ", 3, None, "a red circle " * 1400]),
    # GEN tokens a pass: 256 x 256 patches of a 4096 x 4096 still fit, 48 latent frames of them do not
    pytest.param({"size": [4096, 4096], "frames": 1}, id="tokens-4k-still"),
    pytest.param({"size": [4096, 4096], "frames": 189}, id="tokens-4k-clip(bad)"),
    *_bounds("negative_prompt", ["", "blurry"], [3]),
    *_bounds("task", ["t2v", "t2i"], ["t3v", 3]),
    *_bounds("sound", [False], [True, "yes"]),  # the test checkpoint has no sound_gen
    pytest.param({"prompt": None, "seed": 2**63, "size": [40, 8], "fps": NAN}, id="many-at-once(bad)"),
    # each task with each bad combination
    pytest.param({"task": "t2i", "frames": 1}, id="t2i-one-frame"),
    pytest.param({"task": "t2i", "frames": 5}, id="t2i-five-frames(bad)"),
    pytest.param({"task": "t2i", "fps": 30}, id="t2i-fps"),
    pytest.param({"task": "t2i", "image": "in/frame.png"}, id="t2i-image(bad)"),
    pytest.param({"task": "t2i", "video": "in/clip.mp4"}, id="t2i-video(bad)"),
    pytest.param({"task": "t2v", "image": "in/frame.png"}, id="t2v-image(bad)"),
    pytest.param({"task": "t2v", "video": "in/clip.mp4"}, id="t2v-video(bad)"),
    pytest.param({"task": "i2v", "image": "in/frame.png"}, id="i2v"),
    pytest.param({"task": "i2v", "image": "in/frame.png", "frames": 5}, id="i2v-at-min-frames"),
    pytest.param({"task": "i2v", "image": "in/frame.png", "frames": 1}, id="i2v-one-frame(bad)"),
    pytest.param({"task": "i2v"}, id="i2v-no-image(bad)"),
    pytest.param({"task": "i2v", "image": "in/missing.png"}, id="i2v-missing-file(bad)"),
    pytest.param({"task": "i2v", "image": "in/frame.png", "video": "in/clip.mp4"}, id="i2v-video(bad)"),
    pytest.param({"task": "v2v", "video": "in/clip.mp4"}, id="v2v"),
    pytest.param({"task": "v2v", "video": "in/clip.mp4", "frames": 9}, id="v2v-at-min-frames"),
    pytest.param({"task": "v2v", "video": "in/clip.mp4", "frames": 5}, id="v2v-five-frames(bad)"),
    pytest.param({"task": "v2v"}, id="v2v-no-video(bad)"),
    pytest.param({"task": "v2v", "video": "in/clip.mp4", "image": "in/frame.png"}, id="v2v-image(bad)"),
    pytest.param({"seeds": [1, 2**63 - 1]}, id="sweep"),
    pytest.param({"seeds": [1, 2**63, -4]}, id="sweep-past-bounds(bad)"),
]
DISTILLED_JOBS = [
    pytest.param({}, id="distilled-defaults"),
    pytest.param({"steps": 4, "guidance": 1.0}, id="distilled-own-schedule"),
    pytest.param({"steps": 35}, id="distilled-steps(bad)"),
    pytest.param({"guidance": 6.0}, id="distilled-guidance(bad)"),
    pytest.param({"negative_prompt": "blurry"}, id="distilled-negative-prompt(bad)"),
    pytest.param({"task": "t2i", "steps": 50, "guidance": 7.0}, id="distilled-t2i-image-defaults(bad)"),
]
MODELS = [
    pytest.param(False, {"precision": "bf16"}, id="bf16"),
    pytest.param(False, {"precision": "fp8-dynamic"}, id="fp8-dynamic"),
    pytest.param(False, {"precision": "fp16"}, id="fp16(bad)"),
    pytest.param(False, {"precision": "fp8-static"}, id="fp8-static-on-bf16(bad)"),
    pytest.param(True, {"precision": "fp8-static"}, id="fp8-static"),
    pytest.param(True, {"precision": "bf16"}, id="bf16-on-static-fp8(bad)"),
    pytest.param(True, {"parallel": {"tp_size": 1, "cfg_size": 1}}, id="static-fp8-unsharded"),
    pytest.param(True, {"parallel": {"tp_size": 2, "cp_size": 0}}, id="static-fp8-sharded(bad)"),
    pytest.param(False, {"parallel": {"tp_size": 2}}, id="bf16-sharded(bad)"),
    pytest.param(False, {"parallel": {"pp_size": 1}}, id="unknown-axis(bad)"),
    pytest.param(False, {"step_precision": "sometimes"}, id="step-precision-word(bad)"),
    pytest.param(False, {"step_precision": {"first": 2, "last": 2}}, id="step-override-on-bf16(bad)"),
    pytest.param(True, {"step_precision": {"first": 2, "last": 2}}, id="step-override-on-fp8"),
    pytest.param(True, {"step_precision": {"first": 2}}, id="step-override-half(bad)"),
    pytest.param(False, {"attention": "fp8"}, id="attention-fp8"),
    pytest.param(True, {"attention": "bf16"}, id="attention-bf16"),
    pytest.param(False, {"attention": "int8"}, id="attention-int8(bad)"),
    pytest.param(False, {"attention": True}, id="attention-bool(bad)"),
    pytest.param(True, {"fp8_accumulation": "fp32"}, id="fp8-accumulation-fp32"),
    pytest.param(True, {"fp8_accumulation": "fast"}, id="fp8-accumulation-fast"),
    pytest.param(True, {"fp8_accumulation": "bf16"}, id="fp8-accumulation-bf16(bad)"),
    pytest.param(False, {"fp8_accumulation": None}, id="fp8-accumulation-null(bad)"),
    pytest.param(False, {"cache": "off"}, id="cache-off"),
    pytest.param(False, {"cache": False}, id="cache-yaml-off"),
    pytest.param(True, {"cache": "seacache"}, id="cache-seacache"),
    pytest.param(False, {"cache": {"method": "seacache", "threshold": 0.4, "max_consecutive": 3}}, id="cache-params"),
    pytest.param(False, {"cache": "teacache"}, id="cache-teacache(bad)"),
    pytest.param(False, {"cache": {"method": "seacache", "threshold": -1, "max_consecutive": 1.5}},
                 id="cache-params(bad)"),
]


def _folder(tmp_path, scheduler=None):
    make_checkpoint(tmp_path / "ckpt", **({"scheduler": scheduler} if scheduler else {}))
    (tmp_path / "in").mkdir()
    write_image(tmp_path / "in" / "frame.png")
    write_video(tmp_path / "in" / "clip.mp4")
    return tmp_path


def _load(folder, job: dict, model: dict | None = None) -> list[str]:
    """The manifest's problems as `where: message` lines; [] when it loads."""
    doc = {"version": 1, "name": "agree", "model": {"checkpoint": "ckpt", **(model or {})}, "output": {"root": "out"},
           "jobs": [{"id": "j", **({"prompt": "x"} | job)}]}
    doc["jobs"][0] = {k: v for k, v in doc["jobs"][0].items() if v is not None}  # prompt: None = no prompt key
    path = folder / "agree.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        manifest.load(path)
    except ManifestError as err:
        return [f"{p.where}: {p.message}" for p in err.problems]
    return []


def _as_cosmos3_sees_it(folder, job: dict, seed=None) -> RenderRequest:
    fields = {"prompt": "x", "task": "t2v", **job}
    fields.pop("seeds", None)
    if "size" in fields:
        fields["width"], fields["height"] = fields.pop("size")
    for key in ("image", "video"):
        if key in fields:
            fields[key] = str(folder / fields[key])
    return RenderRequest(**fields, **({} if seed is None else {"seed": seed}))


def _location(field: str, job: dict, seed_index=None) -> str:
    """Where the manifest must point for a problem of `field`: the YAML key holding it, else the job."""
    if field in ("width", "height") and "size" in job:
        return f"jobs[0] (id=j) -> size[{('width', 'height').index(field)}]: {field}: "
    if field == "seed" and seed_index is not None:
        return f"jobs[0] (id=j) -> seeds[{seed_index}]: seed: "
    if field in job and job[field] is not None:
        return f"jobs[0] (id=j) -> {field}: "
    return f"jobs[0] (id=j): {field}: "


def _expected_lines(folder, job: dict, rules: RequestRules) -> set[str]:
    seeds = list(enumerate(job["seeds"])) if "seeds" in job else [(None, None)]
    return {_location(field, job, index) + message
            for index, seed in seeds for field, message in problems(_as_cosmos3_sees_it(folder, job, seed), rules)}


def _refused(request) -> bool:
    """The corpus's own label: a variant marked (bad) must be refused, any other accepted."""
    return "(bad)" in request.node.name


@pytest.mark.parametrize("job", JOBS)
def test_a_job_is_refused_by_farm_validate_exactly_when_cosmos3_refuses_it(tmp_path, job, request):
    folder = _folder(tmp_path)
    expected = _expected_lines(folder, job, RequestRules.from_checkpoint(folder / "ckpt"))
    lines = _load(folder, job)
    assert set(lines) == expected and len(lines) == len(expected)
    assert bool(expected) is _refused(request)


@pytest.mark.parametrize("job", DISTILLED_JOBS)
def test_a_distilled_checkpoint_refuses_the_same_jobs_in_both(tmp_path, job, request):
    folder = _folder(tmp_path, DISTILLED)
    expected = _expected_lines(folder, job, RequestRules.from_checkpoint(folder / "ckpt"))
    assert set(_load(folder, job)) == expected
    assert bool(expected) is _refused(request)


@pytest.mark.parametrize("static_fp8, model", MODELS)
def test_a_model_section_is_refused_exactly_when_cosmos3s_loader_refuses_it(tmp_path, static_fp8, model, request):
    folder = _folder(tmp_path)
    make_checkpoint(folder / "ckpt", static_fp8=static_fp8)
    config = Cosmos3Config.from_dict(json.loads((folder / "ckpt" / "transformer" / "config.json").read_text()))
    found = load_options.problems(config, LoadOptions(**model))
    expected = {f"model -> {' -> '.join(field.split('.'))}: {message}" for field, message in found}
    assert set(_load(folder, {}, model)) == expected
    assert bool(expected) is _refused(request)
