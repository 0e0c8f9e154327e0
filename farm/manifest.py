"""Render manifest v1: YAML -> validated, fully resolved `Job`s.

`load()` checks everything before Ray starts and reports every problem at once, each with
`file:line`, the job and the field (`city.yaml:14: jobs[2] (id=extend) -> size[0]: width: 1000 is not a
multiple of 16 (use 992 or 1008)`). The rules of the model are cosmos3's own, torch-free: the `model`
section goes through `cosmos3.rules.load_options` and every job's request through `cosmos3.rules.request`, the very
checks a worker's pipeline runs, so a manifest that validates renders; this module only says where in
the YAML each (field, message) pair cosmos3 reports comes from. Defaults resolve job field -> manifest
`defaults` -> cosmos3's task default; paths resolve against the manifest's folder; a sweep
(`seeds: [1, 2, 3]`) becomes one job per seed.

A new field needs no rule here: a `LoadOptions` field is a `model:` key and a `RenderRequest` field a
job key, passed through as written and checked by cosmos3. Only a field whose YAML spelling differs
from its name needs a line in `_YAML_KEY` (or `_READ_MODEL_KEY` for YAML's own quirks).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmos3.errors import CheckpointError, ConfigError, FieldProblem
from cosmos3.rules import checkpoint_header, checkpoint_identity, load_options
from cosmos3.rules import request as requests
from cosmos3.rules.config import Cosmos3Config, uses_static_fp8
from cosmos3.rules.load_options import LoadOptions
from cosmos3.rules.request import RenderRequest, RequestRules, shown
from cosmos3.rules.values import yaml_off
from farm import document, fields, records, storage, terminal
from farm import template as templates
from farm.document import Document, Path_, format_path
from farm.errors import ManifestError, OutputPathError, Problem, StorageFault
from farm.job import Job, ModelSpec, config_hash, wav_beside
from farm.storage import RECORDS_DIR

VERSION = 1
DEFAULT_TASK = "t2v"  # a job that names no task renders a clip

_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(RenderRequest))
_LOAD_OPTIONS = tuple(f.name for f in dataclasses.fields(LoadOptions))
# Request fields a manifest spells differently: `size: [width, height]`.
_YAML_KEY: dict[str, Path_] = {"width": ("size", 0), "height": ("size", 1)}
# Model keys whose YAML value needs reading first: YAML 1.1 turns a bare `off` into false.
_READ_MODEL_KEY: dict[str, fields.Checker] = {"step_precision": yaml_off, "cache": yaml_off}
_INPUT_FIELDS = ("image", "video")  # file paths, resolved against the manifest's folder

_TOP_KEYS = {"version": True, "name": True, "model": True, "output": True, "defaults": False, "jobs": True}
_MODEL_KEYS = {"checkpoint": True, **dict.fromkeys(_LOAD_OPTIONS, False)}
_OUTPUT_KEYS = {"root": True, "path": False}
# What the farm itself does with a job (cosmos3 never sees these), with their checkers and defaults.
_RUN_FIELDS: dict[str, tuple[fields.Checker, Any]] = {
    "retries": (fields.integer(0, fields.MAX_RETRIES), 2),
    "timeout": (fields.timeout, 1800.0),
    "priority": (fields.integer(*fields.PRIORITY_RANGE), 0),
}
# The files a job publishes: its media (PNG for t2i, MP4 for video), and the WAV of a clip's sound on request.
_OUTPUTS = "outputs"
_JOB_KEYS = tuple(dict.fromkeys([*(_YAML_KEY.get(f, (f,))[0] for f in _REQUEST_FIELDS), *_RUN_FIELDS, _OUTPUTS]))


@dataclass(frozen=True)
class Manifest:
    path: str  # absolute
    name: str
    sha256: str  # of the manifest file's bytes
    model: ModelSpec
    output_root: str  # absolute
    jobs: tuple[Job, ...]


@dataclass(frozen=True)
class _Model:
    """The model section as the resolver needs it: the spec workers load (None when its options are wrong)
    and the rules jobs are checked by, which only need a readable checkpoint."""

    spec: ModelSpec | None
    rules: RequestRules


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
        self._fine_folders: set[str] = set()  # output folders inside the root, out of its records
        self._root_name_max: int | None = None  # the longest file name the root's file system takes

    def error(self, path: Path_, message: str) -> None:
        self.problems.append(Problem(self.doc.line(path), format_path(path, self.job_ids), message))

    def field_error(self, path: Path_, problem: FieldProblem) -> None:
        """A cosmos3 (field, message) at the YAML `path` its value came from; the message names the field
        unless the path already ends in it, so every line ends with cosmos3's own `field: message`."""
        field, message = problem
        named = tuple(field.split("."))  # `parallel.tp_size` ends the path model -> parallel -> tp_size
        self.error(path, message if path[-len(named):] == named else f"{field}: {message}")

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
        # `version: true` is no version: bool is an int in Python (True == 1).
        if "version" in top and (isinstance(top["version"], bool) or top["version"] != VERSION):
            self.error(("version",), f"this farm reads manifest version {VERSION}, got {shown(top['version'])}")
        name = self._value(top, ("name",), fields.identifier)
        model = self._model(self._section(top, "model"))
        root, template = self._output(self._section(top, "output"))
        defaults = self._defaults(self._section(top, "defaults"))
        raw_jobs = self._job_list(top)
        if root is not None and model is not None and model.spec is not None:
            root = self._outside_checkpoint(root, Path(model.spec.checkpoint))
        if root is not None and name is not None and len(name.encode()) > self._name_max(root):
            self.error(("name",), f"{len(name.encode())} bytes; the farm keeps its records in {RECORDS_DIR}/<name>/ "
                                  f"and the file system of {root} takes names of at most {self._name_max(root)}")
            name = None
        elif root is not None and name is not None and (
                too_long := storage.too_long(records.longest_record(root, name))):
            self.error(("output", "root"), f"the farm's records in {root / RECORDS_DIR / name}/ would not fit: "
                                           f"{too_long} (pick an output.root nearer /, or a shorter name:)")
        jobs = self._jobs(raw_jobs, defaults, model, name, root, template)
        if None in (name, model, root) or model.spec is None or self.problems:
            return None
        return Manifest(str(self.path), name, self.sha256, model.spec, str(root), tuple(jobs))

    def _outside_checkpoint(self, root: Path, checkpoint: Path) -> Path | None:
        """Renders and records stay out of the model's folder: nothing the farm writes may become part of what
        a worker loads, nor land in a folder that is replaced when the checkpoint is updated."""
        if root.is_relative_to(checkpoint):
            self.error(("output", "root"), f"{root} is inside the checkpoint {checkpoint}; renders and the farm's "
                                           "records belong outside the model's folder: pick another output.root")
            return None
        return root

    def _section(self, top: dict, key: str) -> dict | None:
        """The mapping under `key`; None when it is missing (already reported if required) or not a mapping."""
        value = top.get(key)
        if value is not None and not isinstance(value, dict):
            self.error((key,), f"expected a mapping, got {type(value).__name__}")
            return None
        return value

    def _model(self, raw: dict | None) -> _Model | None:
        if raw is None:
            return None
        self._keys(raw, ("model",), _MODEL_KEYS)
        read = {key: self._value(raw, ("model", key), _READ_MODEL_KEY.get(key, fields.anything))
                for key in _LOAD_OPTIONS if key in raw}
        options = LoadOptions(**read)
        checkpoint = self._checkpoint(raw)
        if checkpoint is None:
            return None
        root, config, rules = checkpoint
        found = load_options.problems(config, options)
        for problem in found:
            self.field_error(("model", *problem[0].split(".")), problem)
        try:
            measured = checkpoint_identity.fingerprint(root)
        except CheckpointError as err:
            self.error(("model", "checkpoint"), str(err))
            return _Model(None, rules)
        spec = ModelSpec(str(root), options, uses_static_fp8(config), measured.sha256, measured.files)
        return _Model(None if found else spec, rules)

    def _checkpoint(self, raw: dict) -> tuple[Path, Cosmos3Config, RequestRules] | None:
        """The checkpoint's root, config and request rules, read by cosmos3 as a worker reads them."""
        where = ("model", "checkpoint")
        value = self._value(raw, where, fields.text(required=True))
        if value is None:
            return None
        root = self.base / value
        if not root.is_dir():
            self.error(where, f"{terminal.escape(value)} is not a directory (resolved to {terminal.escape(str(root))})")
            return None
        root = root.resolve()
        try:
            # The loader's own checks, from the JSON and safetensors headers: refused here = refused at load.
            config = checkpoint_header.inspect(root).config
            return root, config, RequestRules.from_checkpoint(root, config)
        except (ConfigError, CheckpointError) as err:
            self.error(where, str(err))
            return None

    def _output(self, raw: dict | None) -> tuple[Path | None, str | None]:
        if raw is None:
            return None, None
        self._keys(raw, ("output",), _OUTPUT_KEYS)
        root = self._value(raw, ("output", "root"), fields.text(required=True))
        template = self._value(raw, ("output", "path"), fields.text(required=True), templates.DEFAULT)
        if template is not None and not self._template_ok(template):
            template = None
        if root is not None and (character := terminal.acting(root)) is not None:
            self.error(("output", "root"), f"{root!r} holds {character}, {terminal.NOT_A_NAME}")
            root = None
        if root is None:
            return None, template
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
        """The `defaults` block as written. The farm's own fields are checked here; request fields are
        cosmos3's to check, in each job that inherits them."""
        raw = raw or {}
        self._keys(raw, ("defaults",), dict.fromkeys(_JOB_KEYS, False))
        for key, (check, _) in _RUN_FIELDS.items():
            self._value(raw, ("defaults", key), check)
        self._value(raw, ("defaults", _OUTPUTS), fields.outputs)
        return raw

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

    def _jobs(self, raw_jobs: list, defaults: dict, model: _Model | None, name, root, template) -> list[Job]:
        first_line: dict[str, int] = {}
        owners: dict[str, str] = {}  # media path -> key of the job writing it
        jobs: list[Job] = []
        for index, raw in enumerate(raw_jobs):
            where = ("jobs", index)
            if not isinstance(raw, dict):
                self.error(where, f"a job is a mapping with at least id and prompt, got {type(raw).__name__}")
                continue
            self._keys(raw, where, {**dict.fromkeys(_JOB_KEYS, False), "id": True, "seeds": False})
            job_id = self._unique_id(raw, where, first_line)
            run = self._run_fields(raw, where, defaults)
            values, shaped = self._request_values(raw, where, defaults)
            sweep = self._seeds(raw, where)
            if model is None:
                continue  # no checkpoint to check requests against (the model section's problems are reported)
            requests_ = [self._request(values, where, seed, model.rules) for seed in sweep]
            if not shaped or None in requests_ or None in (model.spec, job_id, run, name, root, template):
                continue
            outputs = self._outputs(raw, where, defaults, requests_[0], model.rules) if requests_ else None
            if outputs is None:
                continue
            for seed, request in zip(sweep, requests_, strict=True):
                job = self._job(job_id, len(jobs), seed, request, run, model.spec, name, root, template, outputs)
                self._claim_media(job, where, owners, root, Path(model.spec.checkpoint))
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

    def _claim_media(self, job: Job, where: Path_, owners: dict[str, str], root: Path, checkpoint: Path) -> None:
        folder = os.path.dirname(job.media)
        if folder not in self._fine_folders:  # every job's path, symlinks resolved (a folder found fine once)
            try:
                real = templates.check_target(root, job.media, RECORDS_DIR)
                if real.is_relative_to(checkpoint):  # a render there would change the model's files, or be lost
                    self.error(where, f"output path: {real} is inside the checkpoint {checkpoint}; renders belong "
                                      "outside the model's folder (change output.path, or move the checkpoint out "
                                      "of output.root)")
                else:
                    self._fine_folders.add(folder)
            except OutputPathError as err:
                self.error(where, f"output path: {err}")
        for path in job.files:
            if problem := storage.unwritable(root, Path(path), self._name_max(root)):
                self.error(where, f"output path: {problem}")
                break
        if job.media in owners:
            relative = Path(job.media).relative_to(root)
            fix = "put {id} and {seed} in output.path"
            self.error(where, f"writes {relative}, as job {owners[job.media]} does ({fix})")
        owners.setdefault(job.media, job.key)

    def _run_fields(self, raw: dict, where: Path_, defaults: dict) -> dict | None:
        """retries, timeout and priority: the job's, else `defaults`', else the farm's; None if any is wrong."""
        run = {}
        for key, (check, default) in _RUN_FIELDS.items():
            source = raw if key in raw else defaults
            origin = (*where, key) if key in raw else ("defaults", key)
            run[key] = self._value(source, origin, check, default)
        return None if None in run.values() else run

    def _outputs(self, raw: dict, where: Path_, defaults: dict, request: RenderRequest, rules: RequestRules
                 ) -> tuple[str, ...] | None:
        """The formats the job publishes (default: its media alone); None (reported) when it cannot write them.

        A still is one PNG; a clip is an MP4 (with its sound track when it has sound) and, on request, a WAV of
        that sound, which needs the job to render sound. A sweep's seeds share one task and sound setting.
        """
        media = "png" if request.task == "t2i" else "mp4"
        if _OUTPUTS not in raw and media == "png":
            return (media,)  # a still ignores the clips' `defaults: outputs`, as it ignores their frames and fps
        origin = self._origin(raw, where, _OUTPUTS)
        written = self._value(raw if _OUTPUTS in raw else defaults, origin, fields.outputs, (media,))
        if written is None:
            return None
        if media == "png" and written != ("png",):
            self.error(origin, "a t2i job publishes one PNG; outputs must be [png]")
            return None
        if media == "mp4" and ("mp4" not in written or "png" in written):
            self.error(origin, f"a {request.task} job publishes an MP4, and a WAV of its sound on request; "
                               "outputs must be [mp4] or [mp4, wav]")
            return None
        if "wav" in written and not request.sound:
            can = rules.sound.config is not None
            why = "sound is false" if can else f"the checkpoint cannot: {rules.sound.missing}"
            self.error(origin, f"wav is the clip's sound, and this job renders none ({why}); drop wav from outputs")
            return None
        return written

    def _request_values(self, raw: dict, where: Path_, defaults: dict) -> tuple[dict[str, tuple[Any, Path_]], bool]:
        """Each request field a job sets, or inherits from `defaults`, with the YAML path it came from, and
        whether the YAML shapes were right (a `size` of [width, height], file paths as strings).

        Inherited fields the job's task ignores (`frames` on a t2i job, `image` on a t2v one) are left to the
        task's default, as are fields set nowhere.
        """
        task = raw.get("task", defaults.get("task", DEFAULT_TASK))
        unused = requests.unused_fields(task) if task in requests.TASKS else ()
        named = "task" in raw or "task" in defaults
        values: dict[str, tuple[Any, Path_]] = {"task": (task, self._origin(raw, where, "task") if named else where)}
        ok = True
        for key in _JOB_KEYS:
            if key in (*_RUN_FIELDS, _OUTPUTS, "task") or (key not in raw and (key not in defaults or key in unused)):
                continue
            origin = self._origin(raw, where, key)
            value = raw[key] if key in raw else defaults[key]
            if key == "size":
                ok = self._size(value, origin, values) and ok
            elif key in _INPUT_FIELDS:
                path = self._checked(fields.text(required=True), value, origin)
                if path is None:
                    ok = False
                else:
                    values[key] = (str((self.base / path).resolve()), origin)
            else:
                values[key] = (value, origin)
        return values, ok

    def _size(self, value: Any, origin: Path_, values: dict) -> bool:
        sides = self._checked(fields.pair, value, origin)
        if sides is None:
            return False
        for field, side in zip(("width", "height"), sides, strict=True):
            values[field] = (side, (*origin, _YAML_KEY[field][1]))
        return True

    def _origin(self, raw: dict, where: Path_, key: str) -> Path_:
        """Where a value came from: the job when it set it, else `defaults`."""
        return (*where, key) if key in raw else ("defaults", key)

    def _request(self, values: dict, where: Path_, seed: tuple[Any, Path_] | None, rules: RequestRules
                 ) -> RenderRequest | None:
        """The job's request checked by cosmos3, every value resolved; None (problems reported) if refused."""
        if seed is not None:
            values = {**values, "seed": seed}
        kwargs = {field: value for field, (value, _) in values.items()}
        request = RenderRequest(**{"prompt": None, **kwargs})
        found = requests.problems(request, rules)
        for problem in found:
            origin = values.get(problem[0], (None, where))[1]
            self.field_error(origin, problem)
        if found:
            return None
        return requests.resolve(request, rules).request()

    def _seeds(self, raw: dict, where: Path_) -> list[tuple[int, Path_] | None]:
        """[None] for a single job (its seed is a request field), else each seed of the sweep with its path."""
        if "seeds" not in raw:
            return [None]
        if "seed" in raw:
            self.error((*where, "seeds"), "set seed or seeds, not both")
            return []
        sweep = self._value(raw, (*where, "seeds"), fields.seeds)
        return [(seed, (*where, "seeds", i)) for i, seed in enumerate(sweep or ())]

    def _job(self, job_id, order, seed, request: RenderRequest, run: dict, model: ModelSpec, name, root, template,
             outputs: tuple[str, ...]) -> Job:
        key = job_id if seed is None else f"{job_id}@{request.seed}"
        relative = os.path.normpath(templates.render(template, dict(
            name=name, id=job_id, seed=request.seed, task=request.task, width=request.width, height=request.height,
            steps=request.steps)))
        media = root / (relative + (".png" if request.task == "t2i" else ".mp4"))
        wav = str(wav_beside(media)) if "wav" in outputs else None
        inputs = tuple((path, self._input_hash(path)) for path in (request.image, request.video) if path)
        return Job(key=key, id=job_id, order=order, request=request, media=str(media), wav=wav,
                   config_hash=config_hash(request, model, self._input_hash, outputs), inputs=inputs, **run)

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

    def _name_max(self, root: Path) -> int:
        if self._root_name_max is None:
            self._root_name_max = storage.name_max(root)
        return self._root_name_max

    def _input_hash(self, path: str) -> str:
        if path not in self._input_hashes:
            self._input_hashes[path] = storage.input_sha256(path)
        return self._input_hashes[path]
