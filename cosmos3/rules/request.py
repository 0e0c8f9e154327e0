"""A render request, its task defaults (docs/checkpoints.md §4.3) and its validation.

``RenderRequest`` is what callers fill in (``None`` = task default); ``resolve()`` turns it into a
fully concrete ``RenderPlan`` or raises one ``PipelineError`` that lists every problem with its fix.
``problems()`` returns the same problems as (field, message) pairs. Torch-free, like ``cosmos3.rules.sampling``:
the farm checks every job of a manifest with these rules before any GPU stack loads, so a job that
passes ``farm validate`` is one a worker renders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmos3.errors import FieldProblem, PipelineError
from cosmos3.rules.checkpoint_header import check_layout, check_sound_dir, check_vae_dir
from cosmos3.rules.config import TEXT_TOKENIZER_DIR, VAE_DIR, Cosmos3Config, SoundSupport
from cosmos3.rules.model_card import IMAGE_ONLY_TAG, MODEL_CARD, tasks_of
from cosmos3.rules.prompt import PromptSpec, TextBudget
from cosmos3.rules.sampling import SamplingRecipe, load_recipe
from cosmos3.rules.values import is_int, is_number

TASKS = ("t2v", "t2i", "i2v", "v2v")
INPUT_OF_TASK = {"i2v": "image", "v2v": "video"}  # the conditioning input each task needs

# V2V keeps the first two latent frames of the input clean: the published default
# condition_frame_indexes_vision=[0, 1], i.e. the first 5 pixel frames at temporal factor 4.
V2V_CONDITION_LATENT_FRAMES = 2

# What a request may ask of a worker beyond the checkpoint's own rules: each bound keeps a job's memory and its
# positions inside what the model was built for (docs/farm.md, "Limits", gives the reasons).
MAX_SIDE = 4096  # pixels per side: 4K UHD is 3840 wide; the published sizes are 1280x720 and 1024x1024
MAX_LATENT_FRAMES = 128  # per clip: 509 frames at the VAE's 4x (the published clip has 48); the VAE decodes it whole
# GEN tokens of one pass (latent frames x patches per frame): 3x the published 720p clip's 44,160. Attention's
# work grows with its square; the steps' activations and the decode's memory with it.
MAX_GEN_TOKENS = 131_072
# The prompt's duration sentence and the fps-modulated positions take fps; the published clips run at 24 (base_fps).
# A clip's sound lasts frames / fps: 1e6 leaves it no sample, 1e-7 asks for years of it.
FPS_RANGE = (1.0, 120.0)
GUIDANCE_RANGE = (0.0, 20.0)  # published 6 (video) and 7 (image); far above, CFG saturates every pixel
MAX_INPUT_PIXELS = 8192 * 8192  # an I2V image is decoded whole before it is resized to the output size


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


NO_SOUND = SoundSupport(None, "no sound support was given")


def unused_fields(task: str) -> tuple[str, ...]:
    """Fields ``task`` ignores: t2i renders one still (no frames, no fps), and only i2v/v2v take inputs.

    A caller that fills requests from shared defaults (a manifest's ``defaults``) leaves these unset.
    """
    still = ("frames", "fps") if task == "t2i" else ()
    return (*still, *(name for t, name in INPUT_OF_TASK.items() if t != task))


@dataclass(frozen=True)
class RequestRules:
    """The checkpoint's facts a request is checked against: its sampler, its VAE's compression factors and
    whether it can generate sound (``cosmos3.rules.checkpoint_header.check_sound_dir``)."""

    recipe: SamplingRecipe
    spatial_factor: int  # width and height are multiples of it
    temporal_factor: int  # a clip has temporal_factor*k + 1 frames
    patch_size: int  # latent cells per GEN token side (transformer latent_patch_size)
    text: TextBudget  # counts a prompt's tokens as the worker's tokenizer does, and holds their limit
    sound: SoundSupport = NO_SOUND
    tasks: tuple[str, ...] = TASKS  # what the build renders (rules.model_card): t2i alone for an image-only build

    @classmethod
    def from_checkpoint(cls, root: str | Path, transformer: Cosmos3Config | None = None) -> RequestRules:
        """Read ``scheduler/``, ``vae/config.json``, ``text_tokenizer/`` and ``sound_tokenizer/`` of a checkpoint,
        without torch, after checking it holds every component a worker loads (``check_layout``).

        ``transformer``: its parsed ``transformer/config.json``, read here when not given.
        # Raises: CheckpointError or ConfigError when one is missing or unreadable.
        """
        check_layout(Path(root))
        if transformer is None:
            transformer = Cosmos3Config.from_json(Path(root) / "transformer" / "config.json")
        vae = check_vae_dir(Path(root) / VAE_DIR, transformer.latent_channel)
        return cls(load_recipe(root), vae.spatial_factor, vae.temporal_factor, transformer.latent_patch_size,
                   TextBudget.from_dir(Path(root) / TEXT_TOKENIZER_DIR), check_sound_dir(root, transformer),
                   tasks_of(root, TASKS))


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

    def request(self) -> RenderRequest:
        """The request with every default filled in: resolving it again gives this plan."""
        return RenderRequest(
            task=self.task, prompt=self.prompt, negative_prompt=self.negative_prompt, width=self.width,
            height=self.height, frames=self.frames, fps=self.fps, steps=self.steps, guidance=self.guidance,
            seed=self.seed, image=self.image, video=self.video, sound=self.sound_frames is not None,
        )


def shown(value) -> str:
    """``repr`` of a value for a message, shortened: a 400-digit number or a megabyte string stays one line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


def _check_range(value, low: float, high: float) -> str | None:
    if not is_number(value):
        return f"{shown(value)} is not a finite number"
    if not low <= value <= high:
        return f"{shown(value)} is outside the limits [{low:g}, {high:g}]"
    return None


def _or(value, default):
    return default if value is None else value


def _nearest_multiples(value: int, factor: int) -> str:
    low = value // factor * factor
    return f"{factor}" if low == 0 else f"{low} or {low + factor}"


def _check_size(value, factor: int) -> str | None:
    if not is_int(value) or value <= 0:
        return f"{shown(value)} is not a positive whole number of pixels"
    if value > MAX_SIDE:
        return f"{shown(value)} is above the limit of {MAX_SIDE} pixels a side"
    if value % factor:
        return f"{value} is not a multiple of {factor} (use {_nearest_multiples(value, factor)})"
    return None


def _check_frames(task: str, frames, temporal_factor: int) -> str | None:
    if not is_int(frames) or frames < 1:
        return f"{shown(frames)} is not a positive whole number"
    if task == "t2i":
        return None if frames == 1 else (f"task t2i renders one frame, got frames={shown(frames)} "
                                         "(leave it unset, or use t2v)")
    most = (MAX_LATENT_FRAMES - 1) * temporal_factor + 1
    if frames > most:
        return (f"{shown(frames)} is above the limit of {most} ({MAX_LATENT_FRAMES} latent frames at the VAE's "
                f"{temporal_factor}x temporal compression)")
    if (frames - 1) % temporal_factor:
        low = (frames - 1) // temporal_factor * temporal_factor + 1
        return (f"{frames} is not {temporal_factor}k+1, which the VAE's {temporal_factor}x temporal "
                f"compression needs (use {low} or {low + temporal_factor})")
    # Conditioned latent frames stay clean, so at least one latent frame must remain to denoise.
    clean = {"i2v": 1, "v2v": V2V_CONDITION_LATENT_FRAMES}.get(task, 0)
    minimum = clean * temporal_factor + 1
    if frames < minimum:
        return (f"task {task} keeps {clean} latent frame(s) from its input, so it needs frames >= {minimum}; "
                f"got {frames}")
    return None


def _check_text(value, *, required: bool) -> str | None:
    if value is None and required:
        return "required; describe what to render"
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if required and not value.strip():
        return "empty; describe what to render"
    return None


def _check_inputs(request: RenderRequest) -> list[FieldProblem]:
    wanted = INPUT_OF_TASK.get(request.task)
    problems = []
    for field in ("image", "video"):
        value = getattr(request, field)
        if field == wanted and value is None:
            problems.append((field, f"task {request.task} needs an input {field} (set {field}=<path or array>)"))
        elif field != wanted and value is not None:
            hint = next(task for task, name in INPUT_OF_TASK.items() if name == field)
            problems.append((field, f"task {request.task} takes no {field} (drop it, or use task {hint})"))
        elif isinstance(value, (str, Path)) and (problem := _check_input_file(field, Path(value))):
            problems.append((field, problem))
    return problems


def _check_input_file(field: str, path: Path) -> str | None:
    """A file there whose header decodes as an image (Pillow) or a video (ffmpeg); pixels are read at render."""
    if not path.is_file():
        return f"no file at {path}"
    return _check_image_header(path) if field == "image" else _check_video_header(path)


def _check_image_header(path: Path) -> str | None:
    from PIL import Image  # Pillow reads the header alone until the pixels are asked for

    try:
        with Image.open(path) as image:
            width, height = image.size
    except (OSError, Image.DecompressionBombError) as err:
        return f"cannot read {path} as an image ({err})"
    if width * height > MAX_INPUT_PIXELS:
        return f"{path} is {width}x{height}, above the limit of {MAX_INPUT_PIXELS:,} pixels; scale it down"
    return None


def _check_video_header(path: Path) -> str | None:
    import imageio_ffmpeg  # the ffmpeg behind imageio, which decodes the video at render

    try:
        frames = imageio_ffmpeg.read_frames(str(path))  # yields the container's metadata first
        next(frames)
        frames.close()
    except (OSError, RuntimeError, StopIteration) as err:
        return f"cannot read {path} as a video ({_ffmpeg_reason(err)})"
    return None


_FFMPEG_TAGS = re.compile(r"^(?:\[[^\]]*\]\s*)+")  # `[png @ 0x55d3f2f34400] ` before each of ffmpeg's lines


def _ffmpeg_reason(err: BaseException) -> str:
    """ffmpeg's first line saying what is wrong (its log holds a banner and a line per stream); else its last."""
    lines = [_FFMPEG_TAGS.sub("", line).strip() for line in str(err).splitlines() if line.strip()]
    return next((line for line in lines if "Invalid" in line or "Error" in line), lines[-1] if lines else repr(err))


def _check_tokens(request: RenderRequest, rules: RequestRules) -> FieldProblem | None:
    """The GEN tokens of one pass over the job's latents, once width, height and frames are each fine."""
    defaults = TASK_DEFAULTS[request.task]
    width, height = _or(request.width, defaults.width), _or(request.height, defaults.height)
    frames = _or(request.frames, defaults.frames)
    cell = rules.spatial_factor * rules.patch_size  # pixels per token side
    tokens = ((frames - 1) // rules.temporal_factor + 1) * -(-width // cell) * -(-height // cell)
    if tokens <= MAX_GEN_TOKENS:
        return None
    field = "frames" if request.frames is not None and frames > 1 else "width"
    return (field, f"{width}x{height} at {frames} frames is {tokens:,} tokens a pass, above the limit of "
                   f"{MAX_GEN_TOKENS:,}; lower the size or the frames")


def _check_prompts(request: RenderRequest, rules: RequestRules) -> list[FieldProblem]:
    """Each prompt with its metadata sentences, counted by the checkpoint's text tokenizer as the worker encodes it."""
    defaults = TASK_DEFAULTS[request.task]
    spec = PromptSpec(frames=_or(request.frames, defaults.frames), fps=float(_or(request.fps, defaults.fps)),
                      height=_or(request.height, defaults.height), width=_or(request.width, defaults.width))
    found = []
    for field, negative in (("prompt", False), ("negative_prompt", True)):
        problem = rules.text.problem(getattr(request, field), spec, negative=negative)
        if problem:
            found.append((field, problem))
    return found


def _check_sampling(request: RenderRequest, recipe: SamplingRecipe) -> list[FieldProblem]:
    if recipe.is_distilled:
        n = len(recipe.fixed_sigmas)
        checks = [
            ("steps", request.steps in (None, n),
             f"this distilled checkpoint runs its fixed {n}-step schedule, got {request.steps}"),
            ("guidance", request.guidance in (None, 1.0),
             f"this distilled checkpoint has guidance baked in (1.0), got {request.guidance}"),
            ("negative_prompt", not request.negative_prompt,
             "a distilled checkpoint runs no unconditional pass; leave it empty"),
        ]
        return [(field, message) for field, ok, message in checks if not ok]
    found = []
    if request.steps is not None:
        if not is_int(request.steps) or request.steps < 1:
            found.append(("steps", f"{shown(request.steps)} is not a positive whole number"))
        elif request.steps > recipe.train_timesteps:  # more steps than the model's timesteps only repeat them
            found.append(("steps", f"{request.steps} is above the limit of {recipe.train_timesteps} "
                                   "(the scheduler's num_train_timesteps)"))
    if request.guidance is not None and (problem := _check_range(request.guidance, *GUIDANCE_RANGE)):
        found.append(("guidance", problem))
    return found


def _check_sound(request: RenderRequest, sound: SoundSupport) -> str | None:
    if request.sound is None or request.sound is False:
        return None
    if request.sound is not True:
        return f"expected true or false, got {request.sound!r}"
    if request.task == "t2i":
        return "task t2i renders an image, which has no sound track (drop sound, or use a video task)"
    if sound.config is None:
        return f"this checkpoint cannot generate sound ({sound.missing}); set sound to false"
    return None


def problems(request: RenderRequest, rules: RequestRules) -> list[FieldProblem]:
    """Every problem of ``request`` on this checkpoint, as (field, message) pairs; empty when it renders."""
    if request.task not in TASKS:
        return [("task", f"{request.task!r} is not one of {', '.join(TASKS)}")]
    if request.task not in rules.tasks:
        return [("task", f"this checkpoint renders {', '.join(rules.tasks)} only (its {MODEL_CARD} says pipeline_tag: "
                         f"{IMAGE_ONLY_TAG}), so task {request.task} is refused; use task t2i, or a video build")]
    defaults = TASK_DEFAULTS[request.task]
    fps, seed = _or(request.fps, defaults.fps), request.seed
    found = [
        ("prompt", _check_text(request.prompt, required=True)),
        ("negative_prompt", _check_text(request.negative_prompt, required=False)),
        ("width", _check_size(_or(request.width, defaults.width), rules.spatial_factor)),
        ("height", _check_size(_or(request.height, defaults.height), rules.spatial_factor)),
        ("frames", _check_frames(request.task, _or(request.frames, defaults.frames), rules.temporal_factor)),
        ("fps", _check_range(fps, *FPS_RANGE)),
        # torch.Generator.manual_seed takes a signed 64-bit seed.
        ("seed", None if is_int(seed) and 0 <= seed < 2**63 else f"{shown(seed)} is not a whole number in [0, 2**63)"),
        ("sound", _check_sound(request, rules.sound)),
    ]
    found = [(f, m) for f, m in found if m]
    refused = {f for f, _ in found}
    if not refused & {"width", "height", "frames", "fps"}:  # the checks of the whole clip need each part fine
        if (tokens := _check_tokens(request, rules)) is not None:
            found.append(tokens)
        if not refused & {"prompt", "negative_prompt"}:
            found += _check_prompts(request, rules)
    return found + _check_sampling(request, rules.recipe) + _check_inputs(request)


def resolve(request: RenderRequest, rules: RequestRules) -> RenderPlan:
    """Fill in the task defaults and check everything; raises ``PipelineError`` listing every problem.

    An unset ``request.sound`` follows the checkpoint (``rules.sound``); ``sound=True`` on a checkpoint
    without it is refused.
    """
    found = problems(request, rules)
    if found:
        raise PipelineError.listing("render request", found)
    defaults = TASK_DEFAULTS[request.task]
    recipe, sound = rules.recipe, rules.sound
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
