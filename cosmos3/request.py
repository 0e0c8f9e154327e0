"""A render request, its task defaults (reference §4.3) and its validation.

``RenderRequest`` is what callers fill in (``None`` = task default); ``resolve()`` turns it into a
fully concrete ``RenderPlan`` or raises one ``PipelineError`` that lists every problem with its fix.
Torch-free, like ``cosmos3.sampling``: the farm driver can check jobs before any GPU stack loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmos3.config import SoundSupport
from cosmos3.errors import PipelineError
from cosmos3.sampling import SamplingRecipe

TASKS = ("t2v", "t2i", "i2v", "v2v")

# V2V keeps the first two latent frames of the input clean: the published default
# condition_frame_indexes_vision=[0, 1], i.e. the first 5 pixel frames at temporal factor 4.
V2V_CONDITION_LATENT_FRAMES = 2


@dataclass(frozen=True)
class TaskDefaults:
    width: int
    height: int
    frames: int
    fps: float
    steps: int
    guidance: float
    flow_shift: float
    guidance_interval: tuple[float, float] | None = None  # CFG only for timesteps inside (0..1000 scale)


_VIDEO_DEFAULTS = TaskDefaults(width=1280, height=720, frames=189, fps=24.0, steps=35, guidance=6.0, flow_shift=10.0)
TASK_DEFAULTS = {
    "t2v": _VIDEO_DEFAULTS,
    "i2v": _VIDEO_DEFAULTS,
    "v2v": _VIDEO_DEFAULTS,
    # fps is not used for images (no duration sentence, no fps-modulated positions); it is reported.
    "t2i": TaskDefaults(
        width=1024, height=1024, frames=1, fps=24.0, steps=50, guidance=7.0, flow_shift=3.0,
        guidance_interval=(400.0, 1000.0),
    ),
}


@dataclass
class RenderRequest:
    """One job. ``image``/``video``: a path or an array (uint8, or float in [0, 1]) ``[H, W, 3]``/``[T, H, W, 3]``.

    ``sound``: generate the clip's sound with its frames; ``None`` = whenever the checkpoint can (video tasks).
    """

    task: str
    prompt: str
    negative_prompt: str = ""
    width: int | None = None
    height: int | None = None
    frames: int | None = None
    fps: float | None = None
    steps: int | None = None
    guidance: float | None = None
    seed: int = 0
    image: Any = None
    video: Any = None
    sound: bool | None = None


@dataclass(frozen=True)
class RenderPlan:
    """A request with every default filled in and every value checked."""

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
    flow_shift: float | None  # None for the distilled sampler, which takes no shift
    guidance_interval: tuple[float, float] | None
    image: Any
    video: Any
    sound_frames: int | None = None  # sound latent frames denoised with the video; None = a silent render
    sound_samples: int | None = None  # waveform samples of the clip's duration, frames / fps * rate

    @property
    def is_video(self) -> bool:
        return self.frames > 1


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _or(value, default):
    return default if value is None else value


def _nearest_multiples(value: int, factor: int) -> str:
    low = value // factor * factor
    return f"{factor}" if low == 0 else f"{low} or {low + factor}"


def _check_size(problems: list[str], name: str, value, factor: int) -> None:
    if not _is_int(value) or value <= 0:
        problems.append(f"{name}: {value!r} is not a positive whole number of pixels")
    elif value % factor:
        problems.append(f"{name}: {value} is not a multiple of {factor} (use {_nearest_multiples(value, factor)})")


def _check_frames(problems: list[str], task: str, frames, temporal_factor: int) -> None:
    if not _is_int(frames) or frames < 1:
        problems.append(f"frames: {frames!r} is not a positive whole number")
        return
    if task == "t2i":
        if frames != 1:
            problems.append(f"frames: task t2i renders one frame, got frames={frames} (leave it unset, or use t2v)")
        return
    if (frames - 1) % temporal_factor:
        low = (frames - 1) // temporal_factor * temporal_factor + 1
        problems.append(
            f"frames: {frames} is not {temporal_factor}k+1, which the VAE's {temporal_factor}x temporal "
            f"compression needs (use {low} or {low + temporal_factor})"
        )
        return
    # Conditioned latent frames stay clean, so at least one latent frame must remain to denoise.
    clean = {"i2v": 1, "v2v": V2V_CONDITION_LATENT_FRAMES}.get(task, 0)
    minimum = clean * temporal_factor + 1
    if frames < minimum:
        problems.append(
            f"frames: task {task} keeps {clean} latent frame(s) from its input, so it needs frames >= {minimum}; "
            f"got {frames}"
        )


def _check_inputs(problems: list[str], request: RenderRequest) -> None:
    wanted = {"i2v": "image", "v2v": "video"}.get(request.task)
    for field in ("image", "video"):
        value = getattr(request, field)
        if field == wanted and value is None:
            problems.append(f"{field}: task {request.task} needs an input {field} (set {field}=<path or array>)")
        elif field != wanted and value is not None:
            hint = {"image": "i2v", "video": "v2v"}[field]
            problems.append(f"{field}: task {request.task} takes no {field} (drop it, or use task {hint})")
        elif isinstance(value, (str, Path)) and not Path(value).is_file():
            problems.append(f"{field}: no file at {value}")


def _check_sampling(problems: list[str], request: RenderRequest, recipe: SamplingRecipe) -> None:
    if recipe.is_distilled:
        n = len(recipe.fixed_sigmas)
        if request.steps not in (None, n):
            problems.append(f"steps: this distilled checkpoint runs its fixed {n}-step schedule, got {request.steps}")
        if request.guidance not in (None, 1.0):
            problems.append(
                f"guidance: this distilled checkpoint has guidance baked in (1.0), got {request.guidance}"
            )
        if request.negative_prompt:
            problems.append("negative_prompt: a distilled checkpoint runs no unconditional pass; leave it empty")
        return
    if request.steps is not None and (not _is_int(request.steps) or request.steps < 1):
        problems.append(f"steps: {request.steps!r} is not a positive whole number")
    if request.guidance is not None and (not _is_number(request.guidance) or request.guidance < 0):
        problems.append(f"guidance: {request.guidance!r} is not a number >= 0")


def _check_sound(problems: list[str], request: RenderRequest, sound: SoundSupport) -> None:
    if request.sound is None or request.sound is False:
        return
    if request.sound is not True:
        problems.append(f"sound: expected true or false, got {request.sound!r}")
    elif request.task == "t2i":
        problems.append("sound: task t2i renders an image, which has no sound track (drop sound, or use a video task)")
    elif sound.config is None:
        problems.append(f"sound: this checkpoint cannot generate sound ({sound.missing}); set sound to false")


def _collect_problems(
    request: RenderRequest, recipe: SamplingRecipe, spatial: int, temporal: int, sound: SoundSupport
) -> list[str]:
    if request.task not in TASKS:
        return [f"task: {request.task!r} is not one of {', '.join(TASKS)}"]
    defaults = TASK_DEFAULTS[request.task]
    problems: list[str] = []
    for name in ("prompt", "negative_prompt"):
        if not isinstance(getattr(request, name), str):
            problems.append(f"{name}: expected a string, got {type(getattr(request, name)).__name__}")
    _check_size(problems, "width", _or(request.width, defaults.width), spatial)
    _check_size(problems, "height", _or(request.height, defaults.height), spatial)
    _check_frames(problems, request.task, _or(request.frames, defaults.frames), temporal)
    fps = _or(request.fps, defaults.fps)
    if not _is_number(fps) or fps <= 0:
        problems.append(f"fps: {fps!r} is not a number > 0")
    if not _is_int(request.seed) or not 0 <= request.seed < 2**63:
        problems.append(f"seed: {request.seed!r} is not a whole number in [0, 2**63)")
    _check_sampling(problems, request, recipe)
    _check_inputs(problems, request)
    _check_sound(problems, request, sound)
    return problems


NO_SOUND = SoundSupport(None, "no sound support was given")


def resolve(
    request: RenderRequest, recipe: SamplingRecipe, *, spatial_factor: int, temporal_factor: int,
    sound: SoundSupport = NO_SOUND,
) -> RenderPlan:
    """Fill in the task defaults and check everything; raises ``PipelineError`` listing every problem.

    ``sound`` is the checkpoint's (``cosmos3.config.read_sound_support``): an unset ``request.sound``
    follows it, ``sound=True`` on a checkpoint without it is refused.
    """
    problems = _collect_problems(request, recipe, spatial_factor, temporal_factor, sound)
    if problems:
        header = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        raise PipelineError(f"{header} in render request:\n" + "\n".join(f"  {p}" for p in problems))
    defaults = TASK_DEFAULTS[request.task]
    distilled = recipe.is_distilled
    frames, fps = _or(request.frames, defaults.frames), float(_or(request.fps, defaults.fps))
    audible = sound.config is not None and request.task != "t2i" and request.sound is not False
    return RenderPlan(
        task=request.task,
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        width=_or(request.width, defaults.width),
        height=_or(request.height, defaults.height),
        frames=frames,
        fps=fps,
        steps=len(recipe.fixed_sigmas) if distilled else _or(request.steps, defaults.steps),
        guidance=1.0 if distilled else float(_or(request.guidance, defaults.guidance)),
        seed=request.seed,
        flow_shift=None if distilled else defaults.flow_shift,
        guidance_interval=None if distilled else defaults.guidance_interval,
        image=request.image,
        video=request.video,
        sound_frames=sound.config.latent_frames(frames, fps) if audible else None,
        sound_samples=sound.config.samples(frames, fps) if audible else None,
    )
