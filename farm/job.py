"""The contract between the driver and its workers: what to load (`ModelSpec`) and what to render (`Job`).

A leaf: the worker and storage import this module (and storage), never the manifest's YAML resolver.
A job's render request is cosmos3's own `RenderRequest` with every value resolved, so the worker hands
it to the pipeline unchanged and the pipeline checks it with the rules `farm validate` already ran.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from cosmos3.rules.cache_options import hashed_cache
from cosmos3.rules.load_options import LoadOptions
from cosmos3.rules.request import RenderRequest

CONFIG_FORMAT = "farm-config-v2"  # v2: the request is cosmos3's RenderRequest, every load option is hashed


class JobState(str, Enum):
    """How a job stands after a run: the one list of states (a str, so records hold plain "done")."""

    DONE = "done"
    FAILED = "failed"  # refused by the model, or out of retries
    PENDING = "pending"  # not finished yet: never run, interrupted, or left when no worker remained

    def __str__(self) -> str:  # "failed" in messages, not "JobState.FAILED"
        return self.value


@dataclass(frozen=True)
class PlannedMemory:
    """The GPU memory the manifest's largest job needs (`cosmos3.rules.memory_plan`), which a worker checks its GPU
    against before it loads anything."""

    need: int  # bytes, with the VAE decode tiled where that needs less
    job: str  # the job's key
    detail: str  # cosmos3.rules.memory_plan.JobMemory.describe()


@dataclass(frozen=True)
class ModelSpec:
    """What every worker loads, once."""

    checkpoint: str  # absolute path of the checkpoint root
    options: LoadOptions  # cosmos3's load options: Cosmos3Pipeline.from_pretrained(checkpoint, **asdict(options))
    static_fp8: bool
    fingerprint: str  # cosmos3.rules.checkpoint_identity.fingerprint(): the content of every file the loader reads
    # the version of each file the fingerprint hashed (relative path -> {"key", "sha256"}): a worker that finds the same
    # versions hashes none of them again, and one that finds others hashes them and refuses another checkpoint
    files: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    memory: PlannedMemory | None = None  # set by the driver (farm.memory) before it starts workers


@dataclass(frozen=True)
class Job:
    """One render: a manifest job, or one seed of a sweep, with every value resolved."""

    key: str  # unique in the manifest: the id, or `id@seed` for a sweep
    id: str
    order: int  # manifest order; ties in priority go to the earlier job
    request: RenderRequest  # every field concrete; image/video are absolute paths (or None)
    priority: int
    retries: int  # attempts after the first
    timeout: float  # seconds per attempt
    media: str  # absolute path of the PNG or MP4 this job publishes
    config_hash: str  # everything that changes the pixels; a sidecar with another hash is not "done"
    wav: str | None = None  # absolute path of the WAV of the clip's sound (`outputs: [mp4, wav]`), else None
    inputs: tuple[tuple[str, str], ...] = ()  # (path, sha256) of its image or video, as the config hash took it

    @property
    def files(self) -> tuple[str, ...]:
        """Every file the job publishes before its sidecar, in that order."""
        return (self.media,) if self.wav is None else (self.media, self.wav)


def wav_beside(media: str | Path) -> Path:
    """Where a clip's WAV goes: beside its MP4, same name (`city/dusk_s7.mp4` -> `city/dusk_s7.wav`)."""
    return Path(media).with_suffix(".wav")


def config_hash(request: RenderRequest, model: ModelSpec, input_hash: Callable[[str], str],
                outputs: tuple[str, ...]) -> str:
    """Hashes what decides the published files: the request, its inputs' bytes, the model and the formats
    written (a job that now also asks for a WAV is not done); not priority or retries."""
    fields = dict(vars(request))  # flat values: a shallow copy (asdict's deep copy was most of a 100k-seed sweep)
    for key in ("image", "video"):
        fields[key] = input_hash(fields[key]) if fields[key] else None
    load = dict(vars(model.options))
    load["cache"] = hashed_cache(load["cache"], request.frames)
    identity = {"format": CONFIG_FORMAT, "request": fields, "checkpoint": model.fingerprint,
                "load": load, "outputs": list(outputs)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
