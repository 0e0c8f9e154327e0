"""Cosmos3 render pipeline: T2I / T2V / I2V / V2V from a checkpoint in the published layout.

One job runs: prompt -> token ids (both CFG branches) -> UND tower once per branch (cached K/V)
-> denoising loop (step precision chosen once per step, the step cache's decision (cosmos3.step_cache: run the
GEN decoder stack, or reuse its residual), then the cond and uncond passes, CFG, scheduler update, conditioned
latent frames re-pinned) -> VAE decode -> ``uint8 [T, H, W, 3]``.
With sound (a ``sound_gen`` checkpoint with a ``sound_tokenizer/``), sound latents ride in the same
GEN passes, get the same guidance and their own scheduler, and decode to a float waveform.

    pipe = Cosmos3Pipeline.from_pretrained("/ckpt/Cosmos3-Nano", device="cuda")
    out = pipe(RenderRequest(task="t2v", prompt="..."), callback=lambda i, n: ...)
    out.frames, out.fps, out.sound, out.sampling_rate, out.timings, out.info

``pipe(request, frames=sink)`` also hands the frames to a ``FrameSink`` while the VAE decodes them, chunk by chunk
(a render worker's MP4 encode runs beside the decode); ``out.frames`` holds them all the same.

``from_pretrained(..., vae_load="background")`` (a render worker's) returns before the VAE (and the sound tokenizer,
the audio VAE) are built; the first job waits for them only where it needs them, at its decode
(``timings["vae_wait"]``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol, get_args

import numpy as np
import torch

from cosmos3 import load_transformer, ops
from cosmos3.audio import SoundTokenizer
from cosmos3.background_build import BackgroundBuild
from cosmos3.cuda_graphs import enable_cuda_graphs
from cosmos3.errors import BackgroundLoadError, ConfigError
from cosmos3.media import host_frames, load_image, load_video, resize_cover_crop, to_uint8_frames
from cosmos3.prompt_tokenizer import PromptTokenizer
from cosmos3.rules.cache_options import DEFAULT_CACHE, SeaCacheSettings, parse_cache
from cosmos3.rules.checkpoint_header import check_layout, check_sound_dir, transformer_dir
from cosmos3.rules.checkpoint_identity import fingerprint, identity
from cosmos3.rules.config import SOUND_TOKENIZER_DIR, TEXT_TOKENIZER_DIR, VAE_DIR, Cosmos3Config, SoundSupport
from cosmos3.rules.load_options import Precision, parallel_problems
from cosmos3.rules.model_card import tasks_of
from cosmos3.rules.prompt import PromptSpec
from cosmos3.rules.request import (
    NO_SOUND,
    TASKS,
    V2V_CONDITION_LATENT_FRAMES,
    RenderPlan,
    RenderRequest,
    RequestRules,
    resolve,
)
from cosmos3.rules.sampling import SamplingRecipe, guidance_at, load_recipe
from cosmos3.scheduler import make_scheduler, scheduler_step
from cosmos3.step_cache import StepCache
from cosmos3.timing import Clock, MemoryProbe, StepTimes
from cosmos3.vae import VAEBuild, WanVAE

__all__ = ["Cosmos3Pipeline", "FrameSink", "RenderOutput", "RenderRequest"]

VAELoad = Literal["eager", "background"]  # from_pretrained's vae_load
VAE_LOADS = get_args(VAELoad)


@dataclass
class RenderOutput:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    fps: float
    # seconds: vae_wait (for the VAE's build), tokenize, vae_encode (None without conditioning), und, steps (one
    # per step), vae_decode, total
    timings: dict
    info: dict  # precision, step_policy, checkpoint, scheduler, seed, sound and the resolved job
    memory: dict  # MemoryProbe.report(): peak GPU bytes per stage and for the job (None on CPU)
    sound: np.ndarray | None = None  # float32 waveform [channels, N], N = frames / fps * sampling_rate
    sampling_rate: int | None = None  # Hz, as the sound tokenizer decodes


class FrameSink(Protocol):
    """Takes a render's frames while the VAE decodes them: ``start`` once the sound is decoded and before the first
    frame is, then ``write`` with each chunk, in order. The chunks are views of ``RenderOutput.frames``, filled once
    and never written again: a sink may keep them (a thread may read them) without a copy."""

    def start(self, shape: tuple[int, int, int, int], fps: float, sound: np.ndarray | None,
              sampling_rate: int | None) -> None:
        """``shape``: the whole clip's ``[T, H, W, 3]``; ``sound``: float32 ``[channels, N]`` at ``sampling_rate`` Hz,
        or None (silent)."""

    def write(self, frames: np.ndarray) -> None:
        """The next chunk, ``uint8 [T_chunk, H, W, 3]``."""


class Branch(NamedTuple):
    """One side of classifier-free guidance: its token ids ``[S]`` and their UND K/V cache."""

    ids: torch.Tensor
    cache: object  # the model's UND cache; None for an uncond branch no step uses


@dataclass(frozen=True)
class Conditioning:
    """Clean leading latent frames the sampler must keep: ``latents [C, k, H', W']`` (k = 0 for T2V/T2I)."""

    latents: torch.Tensor | None = None

    @property
    def frames(self) -> tuple[int, ...]:
        return () if self.latents is None else tuple(range(self.latents.shape[1]))

    def pin(self, latents: torch.Tensor) -> torch.Tensor:
        """Overwrite the conditioned frames of ``latents [C, T', H', W']`` with their clean values."""
        if self.latents is not None:
            latents[:, : self.latents.shape[1]] = self.latents
        return latents


class Cosmos3Pipeline:
    def __init__(
        self,
        *,
        model,
        vae: VAEBuild,
        tokenizer: PromptTokenizer,
        recipe: SamplingRecipe,
        checkpoint: dict,
        device: torch.device,
        dtype: torch.dtype,
        sound: SoundSupport | None = None,
        sound_tokenizer: BackgroundBuild[SoundTokenizer] | None = None,
        cache: SeaCacheSettings | None = None,
        tasks: tuple[str, ...] = TASKS,
    ):
        self.model = model
        self.cache = cache  # the step cache stills and clips run (None: every step computes)
        self._vae = vae
        self.tokenizer = tokenizer
        self.recipe = recipe
        self.checkpoint = checkpoint
        self.device = device
        self.dtype = dtype
        self.sound = sound or NO_SOUND
        # The request rules, with the VAE's factors from its config.json, read as the farm reads it (VAEConfig).
        self.rules = RequestRules(recipe, vae.config.spatial_factor, vae.config.temporal_factor,
                                  model.config.latent_patch_size, tokenizer.budget, self.sound, tasks)
        self._sound_tokenizer = sound_tokenizer
        self._load_timings: dict = {}  # from_pretrained's seconds per stage of the load

    @property
    def vae(self) -> WanVAE:
        """The VAE; waits for its build while that runs. Raises VAELoadError when the build failed."""
        return self._vae.result()

    @property
    def sound_tokenizer(self) -> SoundTokenizer | None:
        """None on a silent checkpoint; else like ``vae``. Raises SoundTokenizerLoadError when its build failed."""
        return None if self._sound_tokenizer is None else self._sound_tokenizer.result()

    @property
    def load_timings(self) -> dict:
        """from_pretrained's seconds (and bytes) per stage; ``vae`` and ``sound_tokenizer`` are their builds' own
        seconds, None while a background build runs (or, for sound, on a silent checkpoint), and ``total`` the time
        until from_pretrained returned."""
        sound = None if self._sound_tokenizer is None else self._sound_tokenizer.seconds
        return {**self._load_timings, "vae": self._vae.seconds, "sound_tokenizer": sound}

    def _decoders(self, *, sound: bool = True) -> tuple[BackgroundBuild, ...]:
        """The builds a job needs: the VAE, and the sound tokenizer where it has sound (``sound``)."""
        return (self._vae,) if self._sound_tokenizer is None or not sound else (self._vae, self._sound_tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        checkpoint_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        precision: Precision = "auto",
        step_precision: str | dict = "auto",
        attention: str = "auto",
        fp8_accumulation: str = "fast",
        parallel: dict[str, int] | None = None,
        cache: object = DEFAULT_CACHE,
        cuda_graphs: bool = True,
        model=None,
        vae_load: VAELoad = "eager",
    ) -> Cosmos3Pipeline:
        """Load every component; ``dtype`` defaults to bf16 on CUDA and fp32 on CPU. The VAE runs in ``dtype`` on
        CUDA (as diffusers' pipeline does when loaded in bf16: a Nano clip's decode 9.9 s and 26.9 GiB peak in bf16
        vs 15.2 s and 39.4 GiB in fp32 on the H200: benchmarks/results/h200-render.md) and in fp32 on the CPU.

        On CUDA the GEN steps replay CUDA graphs unless ``cuda_graphs=False``. ``precision``, ``step_precision``,
        ``attention``, ``fp8_accumulation`` and ``parallel`` are ``cosmos3.rules.load_options.LoadOptions`` (checked by
        ``load_transformer``). ``cache``: the step cache renders run (``off``, ``seacache`` or its parameters,
        cosmos3.rules.cache_options; checked first). ``model``: a transformer to drive instead of loading ours (FP8
        calibration runs diffusers' model, the one ModelOpt quantizes, through this denoising loop, uncached).

        The text tokenizer loads in a thread, and the VAE builds in another started after it, both before the
        transformer loads, so transformers' and diffusers' imports overlap the checkpoint read (and the tokenizer's
        import never waits for diffusers').
        The sound tokenizer (an audio VAE) builds like the VAE, in a third thread.
        ``vae_load="eager"`` (the default) returns with both built, and raises a failed build's error
        (VAELoadError, SoundTokenizerLoadError). ``"background"`` (the farm's workers) returns as soon as the
        transformer, text tokenizer and recipe are ready; the VAE and the sound tokenizer build on the CPU meanwhile
        and move to the device where a job first needs them (I2V/V2V's encode, the decode: ``timings["vae_wait"]``);
        a failed VAE fails every job, a failed sound tokenizer every job with sound (silent ones still render).
        Either way what needs no diffusers fails here: ``vae/`` is checked before the transformer loads
        (``cosmos3.rules.checkpoint_header.check_vae_dir``: config.json, z_dim against the transformer's latent_channel,
        the weights' header), as ``farm validate`` checks it.
        """
        root = Path(checkpoint_dir)
        cache_settings = parse_cache(cache)
        if found := parallel_problems(parallel):  # before any thread starts; a given ``model`` too runs on one GPU
            raise ConfigError.listing("load options", found)
        check_layout(root)
        # The checkpoint as it is before anything loads: what every sidecar names (the farm's config hash holds it).
        checkpoint = identity(root.resolve(), fingerprint(root.resolve()).sha256)
        if vae_load not in VAE_LOADS:
            raise ValueError(f"vae_load={vae_load!r}: expected one of {', '.join(VAE_LOADS)}")
        device = torch.device(device)
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        clock = Clock(device)
        started = clock()
        # Loaded here, not in the first job; its seconds are the first load's in this process, whoever asked.
        ops_seconds = ops.load_cuda_ops().seconds if device.type == "cuda" else None
        # Threads that import under LIBRARY_IMPORT, all beside the transformer's load: the text tokenizer's takes it
        # first, then the VAE's and the sound tokenizer's (diffusers): behind the VAE's, the tokenizer, which a worker
        # needs before its first job, would wait for diffusers' whole import.
        tokenizer_load = PromptTokenizer.load_in_background(root / TEXT_TOKENIZER_DIR)
        timings = {"ops": ops_seconds}
        config = Cosmos3Config.from_json(transformer_dir(root) / "config.json")
        vae = VAEBuild(root / VAE_DIR, latent_channel=config.latent_channel, device=device,
                       dtype=dtype if device.type == "cuda" else torch.float32)
        sound = check_sound_dir(root, config)
        sound_tokenizer = None
        if sound.config is not None:
            sound_tokenizer = SoundTokenizer.build_in_background(root / SOUND_TOKENIZER_DIR, sound.config,
                                                                 device=device)
        if model is None:
            model = load_transformer(root, device=device, dtype=dtype, precision=precision,
                                     step_precision=step_precision, attention=attention,
                                     fp8_accumulation=fp8_accumulation, parallel=parallel)
            if cuda_graphs and device.type == "cuda":
                enable_cuda_graphs(model)
            read = model.load_report
            timings |= {
                "build": read["build"],  # the model's (empty) parameters allocated on the device
                "attention_kernels": read["attention_kernels"],  # built or loaded (FlashInfer's JIT, cuDNN)
                "checkpoint_read": read["read"],  # safetensors shards straight into them, device copies included
                "checkpoint_bytes": read["bytes"],
                "checkpoint_gb_per_s": read["bytes"] / read["read"] / 1e9 if read["read"] > 0 else None,
            }
        tokenizer = tokenizer_load.result()  # a job's first stage needs it: a worker is not ready without it
        timings["tokenizer"] = tokenizer_load.seconds
        pipe = cls(
            model=model,
            vae=vae,
            tokenizer=tokenizer,
            recipe=load_recipe(root),
            checkpoint=checkpoint,
            device=device,
            dtype=dtype,
            sound=sound,
            sound_tokenizer=sound_tokenizer,
            cache=cache_settings,
            tasks=tasks_of(root, TASKS),
        )
        if vae_load == "eager":
            for build in pipe._decoders():
                build.result()  # waits for the build; raises its error
        pipe._load_timings = {**timings, "total": clock() - started}
        return pipe

    def warm_up(self) -> None:
        """Pays now what a worker's first job would pay for its decode: the VAE's and the sound tokenizer's builds
        (their move to the device), and on a GPU a decode of two latent frames at the default still's and the
        default clip's sizes, where the decoder sets itself up for a size (fastvae's Triton compile, ~8 s on the
        H100, and ~5 s more at a clip's 720p the first time; h100-vae-decode.md; the CPU has no such set-up, and
        a toy's 720p decode there takes seconds). A build that failed is left to the jobs that need it to report,
        as without a warm-up (a failed sound tokenizer fails only jobs with sound)."""
        for build in self._decoders():
            try:
                build.wait()
            except BackgroundLoadError:
                return
        if self.device.type != "cuda":
            return
        for shape in self.warm_up_shapes():
            self.vae.decode(torch.zeros(shape, device=self.device))

    def warm_up_shapes(self) -> list[tuple[int, int, int, int]]:
        """The latents ``[C, T', H', W']`` the warm-up decodes: the default still's, and where the checkpoint renders
        clips, two frames of the default clip's (its first chunk and one after it)."""
        shapes = []
        for task in [task for task in ("t2i", "t2v") if task in self.rules.tasks]:
            plan = resolve(RenderRequest(task=task, prompt="warm-up"), self.rules)
            frames = min(plan.frames, 1 + self._vae.config.temporal_factor)
            shapes.append(self._vae.config.latent_shape(frames, plan.height, plan.width))
        return shapes

    # -- stages ------------------------------------------------------------------------------------

    def _token_ids(self, plan: RenderPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cond [S_cond], uncond [S_uncond])`` token ids on the device."""
        spec = PromptSpec(frames=plan.frames, fps=plan.fps, height=plan.height, width=plan.width)
        ids = self.tokenizer.encode_pair(plan.prompt, plan.negative_prompt, spec)
        return tuple(torch.tensor(branch, dtype=torch.long, device=self.device) for branch in ids)

    def _conditioning(self, plan: RenderPlan) -> Conditioning:
        """Encode the clean leading frames. Only those pixel frames are encoded: the VAE is causal."""
        if plan.task == "i2v":
            pixels = load_image(plan.image)[None]  # [1, H, W, 3]
        elif plan.task == "v2v":
            keep = (V2V_CONDITION_LATENT_FRAMES - 1) * self._vae.config.temporal_factor + 1
            pixels = load_video(plan.video)[:keep]
            if len(pixels) < keep:  # a short clip holds its last frame, as the published pipeline pads
                pixels = np.concatenate([pixels, np.repeat(pixels[-1:], keep - len(pixels), axis=0)])
        else:
            return Conditioning()
        video = resize_cover_crop(pixels, plan.height, plan.width)  # [3, T_cond, H, W]
        return Conditioning(self.vae.encode(video))  # [C, k, H', W']

    def _initial_latents(
        self, plan: RenderPlan, shape: tuple[int, int, int, int], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Vision noise ``[C, T', H', W']`` (``shape``), then sound noise ``[sound_dim, T_s]`` (None when silent).

        Drawn on the CPU, in the published pipeline's order, so a seed gives the same start on every device.
        """
        vision = torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device)
        if plan.sound_frames is None:
            return vision, None
        shape = (self.sound.config.sound_dim, plan.sound_frames)
        return vision, torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device)

    def _velocity(self, latents, sound, t: float, guidance: float, branches, plan: RenderPlan, cond: Conditioning,
                  cache: StepCache | None, step: int):
        """CFG velocities in fp32, vision ``[C, T', H', W']`` and sound ``[sound_dim, T_s]`` (or None).

        The cond pass, then the uncond pass if ``guidance != 1``; both streams mix with the same guidance. With a
        step ``cache``, its decision for the step holds for both passes.
        """
        kwargs = {"fps": plan.fps if plan.is_video else None, "condition_frames": cond.frames,
                  "sound_latents": None if sound is None else sound.to(self.dtype)}
        x = latents.to(self.dtype)
        running = (0,) if guidance == 1.0 else (0, 1)
        compute = cache is None or cache.decide(step, x, running)

        def run(branch: int):
            if not compute:
                return self.model(branches[branch].ids, x, t, und_cache=branches[branch].cache,
                                  stack_residual=cache.residual(branch), **kwargs)
            out = self.model(branches[branch].ids, x, t, und_cache=branches[branch].cache, **kwargs)
            if cache is not None:
                cache.record(branch, out.stack)
            return out

        out = run(0)
        v, v_sound = out.vision.float(), None if out.sound is None else out.sound.float()
        if guidance != 1.0:
            out = run(1)
            v = out.vision.float() + guidance * (v - out.vision.float())
            if v_sound is not None:
                v_sound = out.sound.float() + guidance * (v_sound - out.sound.float())
        v[:, : len(cond.frames)] = 0.0  # conditioned frames do not move, whatever the guidance mix
        return v, v_sound

    # -- the job -----------------------------------------------------------------------------------

    @torch.no_grad()
    def __call__(self, request: RenderRequest, callback: Callable[[int, int], None] | None = None,
                 frames: FrameSink | None = None) -> RenderOutput:
        """Renders ``request``; ``callback(step, steps)`` after each denoising step; ``frames`` takes the frames as
        the VAE decodes them (``FrameSink``)."""
        clock, memory = Clock(self.device), MemoryProbe(self.device)
        start = clock()
        plan = resolve(request, self.rules)  # a refused request is the request's fault: it never waits for the VAE
        decoders = self._decoders(sound=plan.sound_frames is not None)  # the builds this job waits for at its decode
        for build in decoders:  # known broken: fail before the GPU works
            build.raise_if_failed()
        # A job waits for a VAE still building only where it needs it (I2V/V2V's encode, the decode): the build
        # runs on the CPU beside the first job's steps (cosmos3.vae.VAEBuild).
        encode_wait = self._vae.wait() if plan.task in ("i2v", "v2v") else 0.0
        # What the model keeps for passes of another length goes back before the job's memory is measured.
        latent_shape = self._vae.config.latent_shape(plan.frames, plan.height, plan.width)  # the config's: no wait
        self.model.prepare_gen(latent_shape, plan.sound_frames)
        memory.start()
        ids = self._token_ids(plan)
        tokenized = clock()

        cond = self._conditioning(plan)
        encoded = clock()
        memory.mark("vae_encode")

        scheduler = make_scheduler(self.recipe, steps=plan.steps, flow_shift=plan.flow_shift, device=self.device)
        # Schedulers keep per-step state (UniPC's history of model outputs): sound steps its own copy, as diffusers.
        sound_scheduler = copy.deepcopy(scheduler) if plan.sound_frames is not None else None
        timesteps = scheduler.timesteps
        times = [float(t) for t in timesteps.tolist()]  # read from the device once, not once a step
        guidances = [guidance_at(t, plan.guidance, plan.guidance_interval) for t in times]
        cache = self._step_cache(plan, scheduler)
        # Two UND caches, as cond and uncond texts differ; the uncond one only if some step runs CFG.
        und_start = clock()
        branches = (
            Branch(ids[0], self.model.encode_text(ids[0])),
            Branch(ids[1], self.model.encode_text(ids[1]) if any(g != 1.0 for g in guidances) else None),
        )
        und_done = clock()
        memory.mark("und")

        generator = torch.Generator("cpu").manual_seed(plan.seed)
        latents, sound = self._initial_latents(plan, latent_shape, generator)
        latents = cond.pin(latents)
        # Nothing in a step waits for the GPU, so the host queues step i while the GPU runs step i - 1 (the small
        # kernels of CFG and the scheduler never leave it idle), then reports step i - 1 once it has run: the
        # callback's progress is the GPU's, and the host stays one step ahead, no more.
        step_times, n = StepTimes(self.device), len(timesteps)

        def done(step: int) -> None:
            step_times.wait(step)
            if callback is not None:
                callback(step, n)

        step_times.mark()
        for i, t in enumerate(timesteps):
            self.model.set_denoising_step(i, n)  # once, before both CFG passes
            v, v_sound = self._velocity(latents, sound, times[i], guidances[i], branches, plan, cond, cache, i)
            latents = cond.pin(scheduler_step(scheduler, v, t, latents, generator))
            if sound is not None:
                sound = scheduler_step(sound_scheduler, v_sound, t, sound, generator)
            step_times.mark()
            if i > 0:
                done(i - 1)
        done(n - 1)
        memory.mark("steps")

        del branches, v  # the UND caches and the last velocity are not needed to decode
        if self.device.type == "cuda":  # hand the steps' cached blocks back: the decode allocates other sizes
            torch.cuda.empty_cache()
        vae_wait = encode_wait + sum(build.wait() for build in decoders)
        vae = self.vae
        decode_start = clock()
        waveform = None
        if sound is not None:  # the decoder rounds up to whole hops; the clip's duration is plan.sound_samples
            waveform = self.sound_tokenizer.decode(sound)[:, : plan.sound_samples].cpu().numpy()  # [ch, N]
        sampling_rate = None if waveform is None else self.sound.config.sampling_rate
        shape = (plan.frames, plan.height, plan.width, 3)
        if frames is not None:  # the sound first: a sink muxes it as the frames come
            frames.start(shape, plan.fps, waveform, sampling_rate)
        video = host_frames(shape, self.device)  # [T, H, W, 3], filled chunk by chunk
        done = 0
        for chunk in vae.decode_chunks(latents):  # [3, T_chunk, H, W]
            part = to_uint8_frames(chunk, out=video[done:done + chunk.shape[1]])
            done += len(part)
            if frames is not None:
                frames.write(part)
        end = clock()
        memory.mark("vae_decode")
        timings = {
            # blocked on the VAE's build (and the sound tokenizer's) and the move to the device; 0.0 once there
            "vae_wait": vae_wait,
            "tokenize": tokenized - start - encode_wait,  # the request's checks and its token ids
            "vae_encode": encoded - tokenized if cond.latents is not None else None,
            "und": und_done - und_start,
            "steps": step_times.seconds(),
            "vae_decode": end - decode_start,
            "total": end - start,
        }
        return RenderOutput(
            frames=video, fps=plan.fps, timings=timings, info=self._info(plan, scheduler, cache),
            memory={**memory.report(), "vae_decode_tiled": vae.last_decode_tiled},
            sound=waveform, sampling_rate=sampling_rate,
        )

    def _step_cache(self, plan: RenderPlan, scheduler) -> StepCache | None:
        """The job's step cache, stills and clips alike (cache_options says why), on the base sampler only: a distilled
        schedule has four steps, re-noised. A step policy's W8A16 edge steps are always computed."""
        if self.cache is None or self.recipe.is_distilled:
            return None
        n = len(scheduler.timesteps)
        controller = getattr(self.model, "step_controller", None)
        edges = frozenset() if controller is None else frozenset(controller.policy.a16_steps(n))
        return StepCache(self.cache, [float(s) for s in scheduler.sigmas[:n].tolist()], edges)

    def _info(self, plan: RenderPlan, scheduler, cache: StepCache | None) -> dict:
        return {
            "task": plan.task,
            "precision": self.model.precision,
            "fp8_accumulation": self.model.fp8_accumulation,  # how its FP8 GEMMs sum; None for BF16
            "step_policy": self.model.step_policy_info(),
            "attention": self.model.attention.describe(self.device),
            # which graphs the job's passes replayed or captured (cuda_graphs.JobGraphs); None where none are
            "cuda_graphs": None if self.model.cuda_graphs is None else asdict(self.model.cuda_graphs.job),
            # the step cache's settings and which steps it computed and cached; None where every step computed
            "cache": None if cache is None else cache.report(),
            "checkpoint": self.checkpoint,
            "scheduler": type(scheduler).__name__,
            "flow_shift": plan.flow_shift,
            "seed": plan.seed,
            "width": plan.width,
            "height": plan.height,
            "frames": plan.frames,
            "fps": plan.fps,
            "steps": plan.steps,
            "guidance": plan.guidance,
            "guidance_interval": plan.guidance_interval,
            "sound": None if plan.sound_frames is None else {
                "latent_frames": plan.sound_frames, "samples": plan.sound_samples,
                "sampling_rate": self.sound.config.sampling_rate,
            },
        }
