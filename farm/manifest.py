"""Render manifest v1: YAML -> validated, fully resolved `Job`s.

`load()` checks everything before Ray starts and reports every problem at once, each with
`file:line`, the job and the field (`city.yaml:14: jobs[2] (id=extend) -> size: 1000 is not a multiple of 16`).
Defaults resolve job field -> manifest `defaults` -> the task's built-in default (reference §4.3); paths
resolve against the manifest's folder; a sweep (`seeds: [1, 2, 3]`) becomes one job per seed.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from farm import checkpoint, fields, template as templates
from farm import document
from farm.document import Document, Path_, format_path
from farm.errors import ManifestError, OutputPathError, Problem, StorageFault

VERSION = 1
TASKS = ("t2v", "t2i", "i2v", "v2v")
PARALLEL_AXES = ("tp_size", "ulysses_size", "cfg_size", "cp_size", "parallel_vae_size")
RECORDS_DIR = ".farm"  # farm's own records inside output.root; templates may not write there

_TOP_KEYS = {"version": True, "name": True, "model": True, "output": True, "defaults": False, "jobs": True}
_MODEL_KEYS = {"checkpoint": True, "precision": False, "step_precision": False, "parallel": False}
_OUTPUT_KEYS = {"root": True, "path": False}

# Fields a job (or `defaults`) may set, with their checkers.
_JOB_FIELDS: dict[str, fields.Checker] = {
    "task": fields.choice(TASKS),
    "prompt": fields.text(required=True),
    "negative_prompt": fields.text(),
    "steps": fields.integer(1),
    "guidance": fields.number(0.0),
    "size": fields.size,
    "frames": fields.integer(1),
    "fps": fields.number(0.0, inclusive=False),
    "seed": fields.integer(0),
    "retries": fields.integer(0),
    "timeout": fields.duration,
    "priority": fields.integer(),
    "image": fields.text(required=True),
    "video": fields.text(required=True),
}

# Built-in defaults, by task (reference §4.3); a manifest's `defaults` block overrides them.
_COMMON = {"task": "t2v", "negative_prompt": "", "seed": 0, "retries": 2, "timeout": 1800.0, "priority": 0}
_VIDEO = {"steps": 35, "guidance": 6.0, "size": (1280, 720), "frames": 189, "fps": 24.0}
_IMAGE = {"steps": 50, "guidance": 7.0, "size": (1024, 1024), "frames": 1, "fps": 24.0}
_INPUT_OF_TASK = {"i2v": "image", "v2v": "video"}  # the conditioning file each task needs
_VIDEO_ONLY = ("frames", "fps")  # meaningless for t2i: a t2i job may not set them, inherited ones are dropped


@dataclass(frozen=True)
class ModelSpec:
    """What every worker loads, once."""

    checkpoint: str  # absolute path of the checkpoint root
    precision: str  # auto | bf16 | fp8-dynamic
    step_precision: str  # auto | off
    parallel: dict[str, int]
    static_fp8: bool
    fingerprint: str  # farm.checkpoint.fingerprint(): configs, indexes, shard sizes


@dataclass(frozen=True)
class Job:
    """One render: a manifest job, or one seed of a sweep, with every value resolved."""

    key: str  # unique in the manifest: the id, or `id@seed` for a sweep
    id: str
    order: int  # manifest order; ties in priority go to the earlier job
    task: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    frames: int
    fps: float
    steps: int
    guidance: float
    seed: int
    image: str | None  # absolute path, i2v only
    video: str | None  # absolute path, v2v only
    priority: int
    retries: int  # attempts after the first
    timeout: float  # seconds per attempt
    media: str  # absolute path of the PNG or MP4 this job publishes
    config_hash: str  # everything that changes the pixels; a sidecar with another hash is not "done"

    def request(self) -> dict[str, Any]:
        """The keyword arguments of `cosmos3.pipeline.RenderRequest`."""
        keys = ("task", "prompt", "negative_prompt", "width", "height", "frames", "fps", "steps", "guidance", "seed")
        return {**{k: getattr(self, k) for k in keys}, "image": self.image, "video": self.video}


@dataclass(frozen=True)
class Manifest:
    path: str  # absolute
    name: str
    sha256: str  # of the manifest file's bytes
    model: ModelSpec
    output_root: str  # absolute
    jobs: tuple[Job, ...]


def load(path: str | os.PathLike) -> Manifest:
    """Reads and validates a manifest.

    # Raises: ManifestError listing every problem; OSError if the file cannot be read.
    """
    path = Path(path).resolve()
    data = document.read(path)
    doc = document.parse(data)
    return _Resolver(path, doc, hashlib.sha256(data).hexdigest()).resolve()


class _Resolver:
    """Walks one document, collecting problems instead of stopping at the first."""

    def __init__(self, path: Path, doc: Document, sha256: str):
        self.path, self.doc, self.sha256 = path, doc, sha256
        self.base = path.parent
        self.problems: list[Problem] = []
        self.job_ids: dict[int, str] = {}
        self._input_hashes: dict[str, str] = {}
        self._schedule: dict = {}  # a distilled checkpoint's fixed steps and baked-in guidance
        self._fine_folders: set[Path] = set()  # output folders inside the root, out of its records

    def error(self, path: Path_, message: str) -> None:
        self.problems.append(Problem(self.doc.line(path), format_path(path, self.job_ids), message))

    def resolve(self) -> Manifest:
        for path, line, message in self.doc.problems:
            self.problems.append(Problem(line, format_path(path), message))
        top = self.doc.value
        if not isinstance(top, dict):
            if not self.problems:
                self.error((), "a manifest is a mapping with version, name, model, output and jobs")
            raise ManifestError(self.path, self.problems)
        manifest = self._manifest(top)
        if self.problems:
            raise ManifestError(self.path, self.problems)
        return manifest

    # -- sections ------------------------------------------------------------------------------

    def _manifest(self, top: dict) -> Manifest | None:
        self._keys(top, (), _TOP_KEYS)
        if "version" in top and top["version"] != VERSION:
            self.error(("version",), f"this farm reads manifest version {VERSION}, got {top['version']!r}")
        name = self._value(top, ("name",), fields.identifier)
        model = self._model(self._section(top, "model"))
        root, template = self._output(self._section(top, "output"))
        defaults = self._defaults(self._section(top, "defaults"))
        raw_jobs = self._job_list(top)
        jobs = self._jobs(raw_jobs, defaults, model, name, root, template)
        if None in (name, model, root) or self.problems:
            return None
        return Manifest(str(self.path), name, self.sha256, model, str(root), tuple(jobs))

    def _section(self, top: dict, key: str) -> dict | None:
        """The mapping under `key`; None when it is missing (already reported if required) or not a mapping."""
        value = top.get(key)
        if value is not None and not isinstance(value, dict):
            self.error((key,), f"expected a mapping, got {type(value).__name__}")
            return None
        return value

    def _model(self, raw: dict | None) -> ModelSpec | None:
        if raw is None:
            return None
        self._keys(raw, ("model",), _MODEL_KEYS)
        precision = self._value(raw, ("model", "precision"), fields.choice(("auto", "bf16", "fp8-dynamic")), "auto")
        steps = self._value(raw, ("model", "step_precision"), fields.step_precision, "auto")
        parallel = self._parallel(raw.get("parallel", {}))
        ckpt = self._checkpoint(raw)
        # `precision: auto` runs what the checkpoint holds; bf16 / fp8-dynamic do not use its static scales.
        static = ckpt is not None and checkpoint.uses_static_fp8(ckpt[1])
        if static and precision in ("bf16", "fp8-dynamic"):
            self.error(("model", "precision"), f"{precision} would re-quantize this static FP8 checkpoint's "
                                               "calibrated weights; use auto")
        if ckpt is not None and (steps_fixed := checkpoint.distilled_steps(ckpt[0])) is not None:
            self._schedule = {"steps": steps_fixed, "guidance": 1.0}
        if parallel is not None:
            self._check_parallel(parallel, static)
        if ckpt is None or None in (precision, steps, parallel):
            return None
        return ModelSpec(str(ckpt[0]), precision, steps, parallel, static, checkpoint.fingerprint(ckpt[0]))

    def _checkpoint(self, raw: dict) -> tuple[Path, dict] | None:
        where = ("model", "checkpoint")
        value = self._value(raw, where, fields.text(required=True))
        if value is None:
            return None
        root = self.base / value
        if not root.is_dir():
            self.error(where, f"{value} is not a directory (resolved to {root})")
            return None
        try:
            return root.resolve(), checkpoint.read_transformer_config(root)
        except (OSError, ValueError) as err:
            self.error(where, f"cannot read {checkpoint.TRANSFORMER_CONFIG} of {value}: {err}")
            return None

    def _parallel(self, raw: Any) -> dict[str, int] | None:
        where = ("model", "parallel")
        if not isinstance(raw, dict):
            self.error(where, f"expected a mapping of {', '.join(PARALLEL_AXES)}")
            return None
        self._keys(raw, where, {axis: False for axis in PARALLEL_AXES})
        sizes = {axis: self._value(raw, (*where, axis), fields.integer(1), 1) for axis in PARALLEL_AXES}
        return None if None in sizes.values() else sizes

    def _check_parallel(self, parallel: dict[str, int], static_fp8: bool) -> None:
        # A worker owns exactly one GPU (num_gpus=1); static FP8 additionally cannot be sharded at all.
        for axis, size in parallel.items():
            if size == 1:
                continue
            if static_fp8:
                reason = f"static FP8 runs one GPU per worker; got parallel.{axis}={size} (set it to 1)"
            else:
                reason = f"the farm runs one GPU per worker; parallel.{axis}={size} is not supported (set it to 1)"
            self.error(("model", "parallel", axis), reason)

    def _output(self, raw: dict | None) -> tuple[Path | None, str | None]:
        if raw is None:
            return None, None
        self._keys(raw, ("output",), _OUTPUT_KEYS)
        root = self._value(raw, ("output", "root"), fields.text(required=True))
        template = self._value(raw, ("output", "path"), fields.text(required=True), templates.DEFAULT)
        if template is not None and not self._template_ok(template):
            template = None
        if root is None:
            return None, template
        from farm import storage  # storage imports this module (for Job)

        resolved = (self.base / root).resolve()
        try:
            storage.check_root(resolved)
        except StorageFault as err:
            self.error(("output", "root"), str(err))
            return None, template
        return resolved, template

    def _template_ok(self, template: str) -> bool:
        try:
            templates.check(template, RECORDS_DIR)
        except templates.TemplateError as err:
            self.error(("output", "path"), str(err))
            return False
        return True

    def _defaults(self, raw: dict | None) -> dict[str, Any]:
        raw = raw or {}
        self._keys(raw, ("defaults",), dict.fromkeys(_JOB_FIELDS, False))
        values = {k: self._value(raw, ("defaults", k), check) for k, check in _JOB_FIELDS.items() if k in raw}
        return {k: v for k, v in values.items() if v is not None}

    def _job_list(self, top: dict) -> list:
        raw = top.get("jobs", [])
        if not isinstance(raw, list) or ("jobs" in top and not raw):
            self.error(("jobs",), "expected a non-empty list of jobs")
            return []
        for i, item in enumerate(raw):
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                self.job_ids[i] = item["id"]
        return raw

    # -- jobs ----------------------------------------------------------------------------------

    def _jobs(self, raw_jobs: list, defaults: dict, model, name, root, template) -> list[Job]:
        first_line: dict[str, int] = {}
        owners: dict[str, str] = {}  # media path -> key of the job writing it
        jobs: list[Job] = []
        for index, raw in enumerate(raw_jobs):
            where = ("jobs", index)
            if not isinstance(raw, dict):
                self.error(where, f"a job is a mapping with at least id and prompt, got {type(raw).__name__}")
                continue
            self._keys(raw, where, {**dict.fromkeys(_JOB_FIELDS, False), "id": True, "seeds": False})
            job_id = self._unique_id(raw, where, first_line)
            values = self._job_values(raw, where, defaults)
            sweep = self._seeds(raw, where)
            if values is None or job_id is None or None in (model, name, root, template):
                continue
            for seed in sweep:
                job = self._job(job_id, len(jobs), seed, values, model, name, root, template)
                self._claim_media(job, where, owners, root)
                jobs.append(job)
        return jobs

    def _unique_id(self, raw: dict, where: Path_, first_line: dict[str, int]) -> str | None:
        """The job's id; None when it is invalid or taken (the job is still checked, not built)."""
        job_id = self._value(raw, (*where, "id"), fields.identifier)
        if job_id in first_line:
            self.error((*where, "id"), f"duplicate id {job_id!r} (first at line {first_line[job_id]})")
            return None
        if job_id is not None:
            first_line[job_id] = self.doc.line((*where, "id"))
        return job_id

    def _claim_media(self, job: Job, where: Path_, owners: dict[str, str], root: Path) -> None:
        folder = Path(job.media).parent
        if folder not in self._fine_folders:  # every job's path, symlinks resolved (a folder found fine once)
            try:
                templates.check_target(root, job.media, RECORDS_DIR)
                self._fine_folders.add(folder)
            except OutputPathError as err:
                self.error(where, f"output path: {err}")
        if job.media in owners:
            relative = Path(job.media).relative_to(root)
            fix = "put {id} and {seed} in output.path"
            self.error(where, f"writes {relative}, as job {owners[job.media]} does ({fix})")
        owners.setdefault(job.media, job.key)

    def _job_values(self, raw: dict, where: Path_, defaults: dict) -> dict | None:
        """The job's resolved values, or None when any is wrong (every problem is still reported)."""
        checked = {k: self._value(raw, (*where, k), check) for k, check in _JOB_FIELDS.items() if k in raw}
        explicit = {k: v for k, v in checked.items() if v is not None}
        ok = len(explicit) == len(checked)
        task = explicit.get("task", defaults.get("task", _COMMON["task"]))
        builtin = {**_COMMON, **(_IMAGE if task == "t2i" else _VIDEO), **self._schedule}
        values = {**builtin, **defaults, **explicit}
        for key, fixed in self._schedule.items():
            if values[key] != fixed:
                self.error((*where, key), f"{values[key]} on a distilled checkpoint, which runs its fixed "
                                          f"{self._schedule['steps']}-step schedule with guidance 1.0 "
                                          f"(remove {key}, or set it to {fixed})")
                ok = False
        if self._schedule and values.get("negative_prompt"):
            self.error((*where, "negative_prompt"), "a distilled checkpoint runs without CFG: remove negative_prompt")
            ok = False
        if "prompt" not in values and "prompt" not in checked:
            self.error(where, "prompt: required")
            ok = False
        if "task" in checked and "task" not in explicit:
            return None  # a wrong task: its task-specific checks would only add noise
        return values if self._task_fields(values, explicit, task, where, builtin) and ok else None

    def _task_fields(self, values: dict, explicit: dict, task: str, where: Path_, builtin: dict) -> bool:
        ok = True
        for key in ("image", "video"):
            if key in explicit and _INPUT_OF_TASK.get(task) != key:
                self.error((*where, key), f"only {_task_taking(key)} jobs take {key}; this job's task is {task}")
                ok = False
            elif _INPUT_OF_TASK.get(task) != key:
                values[key] = None  # inherited from defaults, not used by this task
        needed = _INPUT_OF_TASK.get(task)
        if needed:
            values[needed] = self._input_file(values.get(needed), where, needed, key_in_job=needed in explicit)
            ok = ok and values[needed] is not None
        if task == "t2i":
            ok = self._image_only(values, explicit, where, builtin) and ok
        else:
            frames = self._checked(fields.video_frames, values["frames"], self._origin(explicit, where, "frames"))
            ok = ok and frames is not None
        return ok

    def _image_only(self, values: dict, explicit: dict, where: Path_, builtin: dict) -> bool:
        bad = [k for k in _VIDEO_ONLY if k in explicit and not (k == "frames" and explicit[k] == 1)]
        for key in bad:
            self.error((*where, key), f"a t2i job renders one image; remove {key}")
        values.update({k: builtin[k] for k in _VIDEO_ONLY})
        return not bad

    def _origin(self, explicit: dict, where: Path_, key: str) -> Path_:
        """Where a resolved value came from: the job when it set it, else `defaults`."""
        return (*where, key) if key in explicit else ("defaults", key)

    def _input_file(self, value: str | None, where: Path_, key: str, key_in_job: bool) -> str | None:
        if value is None:
            self.error(where, f"{key}: required for {_task_taking(key)} jobs")
            return None
        path = (self.base / value).resolve()
        if not path.is_file():
            self.error((*where, key) if key_in_job else ("defaults", key), f"{value} not found (resolved to {path})")
            return None
        return str(path)

    def _seeds(self, raw: dict, where: Path_) -> list[int | None]:
        """None for a single job (its seed is `values["seed"]`), else one entry per seed of the sweep."""
        if "seeds" not in raw:
            return [None]
        if "seed" in raw:
            self.error((*where, "seeds"), "set seed or seeds, not both")
            return []
        sweep = self._value(raw, (*where, "seeds"), fields.seeds)
        return list(sweep) if sweep else []

    def _job(self, job_id, order, seed, values, model, name, root, template) -> Job:
        key = job_id if seed is None else f"{job_id}@{seed}"
        values = {**values, "seed": values["seed"] if seed is None else seed}
        width, height = values["size"]
        relative = os.path.normpath(templates.render(template, dict(
            name=name, id=job_id, seed=values["seed"], task=values["task"], width=width, height=height,
            steps=values["steps"])))
        media = root / (relative + (".png" if values["task"] == "t2i" else ".mp4"))
        resolved = {k: values[k] for k in _JOB_FIELDS if k != "size"}
        job = Job(key=key, id=job_id, order=order, width=width, height=height, media=str(media), config_hash="",
                  **resolved)
        return _with_hash(job, model, self._input_hash)

    # -- helpers -------------------------------------------------------------------------------

    def _keys(self, raw: dict, where: Path_, allowed: dict[str, bool]) -> None:
        """Unknown keys (with a suggestion) and missing required ones."""
        for key in raw:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), list(allowed), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.error((*where, key), f"unknown key{hint}")
        for key, required in allowed.items():
            if required and key not in raw:
                self.error(where, f"{key}: required")

    def _value(self, raw: dict, where: Path_, check: fields.Checker, default: Any = None) -> Any:
        """The checked value at `where`, `default` when absent, None (and a problem) when invalid."""
        if where[-1] not in raw:
            return default
        return self._checked(check, raw[where[-1]], where)

    def _checked(self, check: fields.Checker, value: Any, where: Path_) -> Any:
        try:
            return check(value)
        except fields.Invalid as err:
            self.error(where, str(err))
            return None

    def _input_hash(self, path: str) -> str:
        if path not in self._input_hashes:
            self._input_hashes[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        return self._input_hashes[path]


def _task_taking(key: str) -> str:
    return next(task for task, input_key in _INPUT_OF_TASK.items() if input_key == key)


def _with_hash(job: Job, model: ModelSpec, input_hash) -> Job:
    """Hashes what decides the pixels: the request, the inputs' bytes and the model; not priority or retries."""
    request = job.request()
    for key in ("image", "video"):
        request[key] = input_hash(request[key]) if request[key] else None
    identity = {"format": "farm-config-v1", "request": request, "checkpoint": model.fingerprint,
                "precision": model.precision, "step_precision": model.step_precision}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return replace(job, config_hash=digest)
