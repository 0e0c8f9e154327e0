"""GPU memory a job needs, planned before a byte of weights is read; torch-free.

    model = ModelMemory.from_checkpoint(root)             # resident bytes from the safetensors headers
    job = plan_job(model, plan, text_tokens=600)          # one resolved request (cosmos3.rules.request.RenderPlan)
    job.need                                              # bytes a GPU must have for it

A job's peak is the resident model plus the larger of its two phases, which never overlap: the denoising steps'
activations (and the step cache's residuals), then the VAE decode, tiled where the untiled one does not fit. The
activation model is fitted on the Nano clip uncached on an H200 (``benchmarks/results/h200-step-cache.md``: 20.67 GiB
allocated in its steps) and on the cached Nano and Super clips on an H100 (``h100-render.md``, ``h100-super.md``); it
scales with each term's own width, so one fit serves both shapes; ``benchmarks/bench_memory.py`` prints the
estimate beside the measured peak for both. ``farm plan`` shows each job's estimate, the driver refuses a job no GPU
of the cluster holds, and a worker refuses a GPU too small for its manifest's largest job before it loads anything
(docs/farm.md, "GPU memory").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from cosmos3.rules.checkpoint_header import (
    SKIPPED,
    TensorHeader,
    check_vae_dir,
    read_header,
    read_tensors,
    transformer_dir,
)
from cosmos3.rules.config import SOUND_TOKENIZER_DIR, VAE_DIR, Cosmos3Config
from cosmos3.rules.prompt import PromptSpec
from cosmos3.rules.request import RenderRequest, RequestRules

GIB = 1 << 30

# Per GEN token and intermediate channel, the MLP's live tensors at its peak: the gate and up projections' BF16
# outputs (2 + 2 bytes), their SwiGLU product (2) and its FP8 copy for the down projection (1).
MLP_BYTES = 7
# Per GEN token and hidden channel, everything else live at that moment (the residual stream, its normed copy, the
# attention's output, the step's latents and velocities): what the Nano clip's 4.00 GiB of step activations at
# 44,160 tokens leaves after MLP_BYTES (20.67 GiB peak - 15.36 GiB weights - 1.31 GiB VAE in BF16).
HIDDEN_BYTES = 2.75
# What a cached clip's steps hold beyond an uncached one's, in [tokens, hidden] BF16 tensors: the step cache's four
# residuals (two per CFG branch), the stack input a computed pass keeps for its residual, a record's newest residual
# before the oldest is dropped, and the cached step's own temporaries. Fitted on the cached clips through the farm on
# the H100 (benchmarks/results/h100-render.md, h100-super.md: 7.85 GiB above the model for Nano, 12.37 for Super,
# i.e. 10.7 and 10.1 such tensors beyond the uncached activations), rounded up.
CACHE_TENSORS = 11
# An untiled Wan 2.2 decode of 189 frames at 1280x720 peaked 22.4 GiB above the resident model in fp32 and 11.1 GiB
# in bf16 on the H200 (benchmarks/results/h200-render.md): ~138 and ~68 bytes per output pixel; per byte of the
# VAE's dtype, rounded up.
UNTILED_DECODE_BYTES_PER_PIXEL_PER_ELEMENT_BYTE = 38
# diffusers' AutoencoderKLWan tiles of 256 x 256 output pixels (tile_sample_min_height/width); a tiled decode holds
# one tile's activations and the whole output.
DECODE_TILE_PIXELS = 256 * 256
VAE_BYTES = 2  # the pipeline decodes in BF16 on CUDA
# Beyond the allocator's peak: the CUDA context, cuBLAS handles and the allocator's own slack (reserved - allocated
# stood 3.4 GiB above the Nano clip's peak with expandable segments; the context takes ~0.5 GiB).
DEVICE_OVERHEAD = 4 * GIB


@dataclass(frozen=True)
class ModelMemory:
    """What a checkpoint keeps on the GPU, and the widths its activations scale with."""

    weights: int  # transformer tensors as stored (FP8 projections 1 byte an element), those the loader skips left out
    vae: int  # VAE weights in VAE_BYTES
    sound: int  # the sound tokenizer's weights as stored; 0 without one
    hidden: int
    intermediate: int
    layers: int
    kv_width: int  # num_key_value_heads * head_dim: one token's K (or V) in one layer
    patch: int  # latent cells per GEN token side
    spatial: int  # VAE spatial factor
    temporal: int  # VAE temporal factor

    @property
    def resident(self) -> int:
        return self.weights + self.vae + self.sound

    @classmethod
    def from_checkpoint(cls, root: str | Path, config: Cosmos3Config | None = None) -> ModelMemory:
        """Read the headers of ``transformer/``, ``vae/`` and ``sound_tokenizer/``; no tensor data.

        # Raises: ConfigError / CheckpointError naming the file, as the loader would.
        """
        root = Path(root)
        directory = transformer_dir(root)
        config = config or Cosmos3Config.from_json(directory / "config.json")
        weights = sum(t.nbytes for key, t in read_tensors(directory).items()
                      if key not in SKIPPED and "_quantizer." not in key)
        vae = check_vae_dir(root / VAE_DIR, config.latent_channel)
        sound_file = root / SOUND_TOKENIZER_DIR / "diffusion_pytorch_model.safetensors"
        return cls(
            weights=weights, vae=_elements(root / VAE_DIR / "diffusion_pytorch_model.safetensors") * VAE_BYTES,
            sound=_stored_bytes(sound_file) if config.sound_gen and sound_file.is_file() else 0,
            hidden=config.hidden_size, intermediate=config.intermediate_size, layers=config.num_hidden_layers,
            kv_width=config.num_key_value_heads * config.head_dim, patch=config.latent_patch_size,
            spatial=vae.spatial_factor, temporal=vae.temporal_factor,
        )


def _elements(path: Path) -> int:
    return sum(math.prod(shape) for _, shape, _ in read_header(path).values())


def _stored_bytes(path: Path) -> int:
    return sum(TensorHeader(key, path, dtype, shape).nbytes for key, (dtype, shape, _) in read_header(path).items())


@dataclass(frozen=True)
class JobMemory:
    """One job's planned GPU memory, in bytes."""

    gen_tokens: int  # GEN tokens a pass: latent frames x patches (x sound frames)
    steps: int  # the denoising steps' activations, UND caches and step-cache residuals
    decode: int  # the VAE decode's activations and output
    tiled: bool  # the decode tiles because the untiled one would not fit the GPU given
    peak: int  # resident + max(steps, decode): what torch allocates at most
    need: int  # peak + DEVICE_OVERHEAD: the GPU memory the job needs

    def describe(self) -> str:
        decode = "tiled decode" if self.tiled else "decode"
        return (f"{self.need / GIB:.1f} GiB ({self.peak / GIB:.1f} GiB peak: steps {self.steps / GIB:.1f}, "
                f"{decode} {self.decode / GIB:.1f}, at {self.gen_tokens:,} tokens a pass)")


def plan_job(model: ModelMemory, *, width: int, height: int, frames: int, text_tokens: int, cached: bool,
             sound_frames: int = 0, gpu_memory: int | None = None) -> JobMemory:
    """The memory of one resolved job (``RenderPlan``'s values). ``text_tokens``: the prompt tokens of every
    branch it runs (cond, and uncond under CFG: each keeps its UND cache); ``cached``: the step cache keeps its
    residuals; ``gpu_memory``: the GPU's bytes, which decide whether the decode tiles (None: untiled)."""
    cell = model.spatial * model.patch
    latent_frames = (frames - 1) // model.temporal + 1
    tokens = latent_frames * -(-height // cell) * -(-width // cell) + sound_frames
    steps = tokens * (MLP_BYTES * model.intermediate + HIDDEN_BYTES * model.hidden)
    steps += text_tokens * model.layers * 2 * model.kv_width * 2  # the UND K/V caches in BF16
    if cached:
        steps += CACHE_TENSORS * tokens * model.hidden * 2
    pixels = width * height
    untiled = frames * pixels * UNTILED_DECODE_BYTES_PER_PIXEL_PER_ELEMENT_BYTE * VAE_BYTES
    output = frames * pixels * 3 * VAE_BYTES
    tiled_bytes = frames * min(pixels, DECODE_TILE_PIXELS) * UNTILED_DECODE_BYTES_PER_PIXEL_PER_ELEMENT_BYTE * \
        VAE_BYTES + output
    # As the pipeline decides (cosmos3.vae): tiles only where the untiled decode does not fit; gpu_memory=0 asks
    # for the least a job can need.
    tiled = (gpu_memory is not None and model.resident + untiled + DEVICE_OVERHEAD > gpu_memory
             and tiled_bytes < untiled)
    decode = tiled_bytes if tiled else untiled
    peak = model.resident + int(max(steps, decode))
    return JobMemory(tokens, int(steps), int(decode), tiled, peak, peak + DEVICE_OVERHEAD)


def plan_request(model: ModelMemory, rules: RequestRules, request: RenderRequest, *, cache: bool,
                 gpu_memory: int | None = None) -> JobMemory:
    """``plan_job`` for a request with every field resolved (``cosmos3.rules.request.resolve(...).request()``, a farm
    job's request): its prompts counted by the checkpoint's tokenizer (``rules.text``), its sound frames by
    ``rules.sound``. ``cache``: the model's step cache is on (never on a distilled checkpoint)."""
    r = request
    spec = PromptSpec(frames=r.frames, fps=float(r.fps), height=r.height, width=r.width)
    text = rules.text.count(r.prompt, spec, negative=False)
    if r.guidance != 1.0:  # the unconditional branch keeps its own UND cache
        text += rules.text.count(r.negative_prompt, spec, negative=True)
    sound = rules.sound.config.latent_frames(r.frames, r.fps) if r.sound and rules.sound.config else 0
    cached = cache and not rules.recipe.is_distilled
    return plan_job(model, width=r.width, height=r.height, frames=r.frames, text_tokens=text, cached=cached,
                    sound_frames=sound, gpu_memory=gpu_memory)
