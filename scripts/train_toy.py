"""Train the toy Cosmos3 checkpoint on CPU and write it as BF16 and as static FP8.

    python scripts/train_toy.py                       # -> checkpoints/toy/{bf16,fp8}
    python scripts/train_toy.py --out /tmp/toy --vae-steps 20 --steps 20    # a smoke run
    python scripts/train_toy.py --fp8-only            # re-export checkpoints/toy/fp8 from bf16 (ModelOpt)
    python scripts/train_toy.py --vae-from checkpoints/toy/bf16/vae         # keep a trained VAE, retrain the rest
    python scripts/train_toy.py --vae-from V --transformer-from T --steps 300 --lr 3e-4   # fine-tune a trained one

Stages: word-level tokenizer -> a small AutoencoderKLWan trained on drawn scenes -> a small decoder-only
Cosmos3AVAEAudioTokenizer trained to sound each clip's tone (toy.audio) -> latents of a fixed scene set
(clips with their sound latents) -> diffusers' Cosmos3OmniTransformer trained by flow matching on
vision and sound tokens together (EMA weights kept) -> the BF16
checkpoint -> ModelOpt (cosmos3.checkpoint.fp8_export, ``pip install .[quantize]``) calibrates on real renders of
our pipeline (sound on) and writes the static FP8 checkpoint, with the published diffusion_step_policy ->
accuracy of FP8 renders, read from their pixels and their tones. Everything is seeded: the same arguments
on the same machine give the same files.

Every stage runs single-threaded (``OMP_NUM_THREADS=1``: two OpenMP threads on shared cores spin-wait for each
other), so other processes take what does not wait on the main line: the sound decoder trains beside the VAE, the
VAE's batches are drawn ahead of its steps, and the scene encoding is split between two processes by batch. Each
piece draws from its own seeded stream and is computed by the same code at the same thread count, so the files
are those of a one-process run, bit for bit.
"""

from __future__ import annotations

import argparse
import copy
import math
import multiprocessing
import shutil
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY, export_fp8  # noqa: E402
from cosmos3.media import resize_cover_crop  # noqa: E402
from cosmos3.pipeline import Cosmos3Pipeline  # noqa: E402
from cosmos3.prompt_tokenizer import PromptTokenizer  # noqa: E402
from cosmos3.rules.prompt import PromptSpec, with_metadata  # noqa: E402
from toy import audio, flow, measure, scenes  # noqa: E402
from toy.layout import (  # noqa: E402
    PROMPT_WORDS,
    UNIPC_SCHEDULER,
    save_transformer,
    write_pipeline_files,
    write_tokenizer,
)

Z_DIM = 16  # latent channels (48 in the published VAE)
VOCAB_SIZE = 80  # >= the toy tokenizer's 66 tokens; a small embedding keeps the files small

# A Wan 2.2-shaped VAE (residual, patchified, spatial factor 16, temporal factor 4), made cheap enough to
# train on a CPU: a 4x4 patchify and two downsamples instead of 2x2 and three, so the convolutions run
# at a quarter of the resolution.
VAE_CONFIG = {
    "base_dim": 16,
    "decoder_base_dim": 16,
    "z_dim": Z_DIM,
    "dim_mult": [1, 2, 2],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [True, True],
    "is_residual": True,
    "in_channels": 3 * 4 * 4,
    "out_channels": 3 * 4 * 4,
    "patch_size": 4,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
}

# The Nano architecture, small: 4 MoT layers of hidden 192 (Nano: 36 of 4096).
TRANSFORMER_CONFIG = {
    "hidden_size": 192,
    "head_dim": 32,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "intermediate_size": 512,
    "latent_channel": Z_DIM,
    "latent_patch_size": 2,
    "patch_latent_dim": Z_DIM * 2 * 2,
    "vocab_size": VOCAB_SIZE,
    # head_dim 32 -> 16 rotary frequencies, split T/H/W like the published [24, 20, 20] of 64.
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [6, 5, 5], "rope_type": "default"},
    "sound_gen": True,  # clips carry their tone's latents (toy.audio), 25 per second as Nano's
    "sound_dim": audio.SOUND_DIM,
    "action_gen": False,
}


@dataclass(frozen=True)
class Settings:
    seed: int
    vae_steps: int
    sound_steps: int  # sound decoder optimizer steps
    images: int  # still scenes in the transformer's training set
    clips: int  # moving scenes in the transformer's training set
    steps: int  # transformer optimizer steps
    lr: float
    eval_seeds: int


# -- tokenizer ----------------------------------------------------------------------------------


def make_tokenizer(root: Path) -> PromptTokenizer:
    """Write ``text_tokenizer/`` and load it back through AutoTokenizer, the path the pipeline takes."""
    write_tokenizer(root / "text_tokenizer", PROMPT_WORDS + scenes.CAPTION_WORDS, vocab_size=VOCAB_SIZE)
    return PromptTokenizer.from_pretrained(root / "text_tokenizer")


# -- VAE ----------------------------------------------------------------------------------------

VAE_LR = 6e-4  # 1e-3 and above oscillate; much below learns shapes too slowly for the time budget
VAE_STILL_BATCH, VAE_CLIP_BATCH = 16, 4
VAE_SHAPE_WEIGHT = 4.0  # extra loss weight of shape pixels
VAE_STILLS_ONLY = 0.5  # share of the steps spent on stills before clips join (shapes first, then motion)


def draw_batch(rng: np.random.Generator, count: int, *, moving: bool) -> tuple[list[scenes.Scene], torch.Tensor]:
    """``count`` random scenes and their pixels ``[B, 3, T, H, W]`` in [-1, 1]."""
    frames = scenes.FRAMES if moving else 1
    batch = [scenes.random_scene(rng, moving=moving) for _ in range(count)]
    pixels = [resize_cover_crop(scenes.draw(s, size=scenes.SIZE, frames=frames, rng=rng), scenes.SIZE, scenes.SIZE)
              for s in batch]
    return batch, torch.stack(pixels)


def _cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _descend(optimizer, loss: torch.Tensor, lr: float) -> None:
    """One AdamW step at ``lr`` with the gradient norm clipped to 1 (a bad batch cannot throw training off)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)
    optimizer.step()


def _reconstruction_loss(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """L1 + MSE over ``[B, 3, T, H, W]``, shape pixels weighted up: a shape covers a few percent of a
    frame, and an unweighted loss lets it fade into the background colour for hundreds of steps."""
    shape = ((x - x[..., :1, :1]).abs().amax(1, keepdim=True) > 0.05).float()  # the corner is background
    weight = 1 + VAE_SHAPE_WEIGHT * shape  # [B, 1, T, H, W]
    error = (y - x).abs() + (y - x) ** 2
    return (weight * error).mean() / weight.mean()


@torch.no_grad()
def _start_time_as_identity(vae) -> None:
    """Make a fresh VAE treat a clip as a stack of stills, so clips start from what stills teach.

    Causal 3x3x3 convolutions forget their past-frame taps; a temporal downsample keeps the latest
    frame of each pair; a temporal upsample repeats each frame. A still never reads any of these
    weights (its past frames are zero padding), so stills train as before, and a clip starts as the
    still code of each chunk's last frame, held for the chunk: coarse motion that clip batches refine.
    """
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanResample

    for module in vae.modules():
        if isinstance(module, WanCausalConv3d) and module.kernel_size == (3, 3, 3):
            module.weight[:, :, :2] = 0.0  # [out, in, t, h, w]: taps t=0, 1 read the two previous frames
        if isinstance(module, WanResample) and hasattr(module, "time_conv"):
            weight = module.time_conv.weight  # [out, in, 3, 1, 1]; upsample: out = 2 * in, one half per new frame
            weight.zero_()
            weight[:, :, 2, 0, 0] = torch.eye(weight.shape[1]).repeat(weight.shape[0] // weight.shape[1], 1)
            module.time_conv.bias.zero_()


def draw_vae_batches(settings: Settings, batches) -> None:
    """Put the VAE's training batches ``[B, 3, T, H, W]`` on the queue ``batches`` in step order, drawn from
    one random stream (seed ``settings.seed``): run in a second process, the drawing (~40 s) overlaps training."""
    rng = np.random.default_rng(settings.seed)
    stills_only = int(settings.vae_steps * VAE_STILLS_ONLY)
    for step in range(settings.vae_steps):
        moving = step >= stills_only and step % 2 == 1
        # As an array, pickled by value: a tensor would travel as a shared-memory handle that dies with this process.
        batches.put(draw_batch(rng, VAE_CLIP_BATCH if moving else VAE_STILL_BATCH, moving=moving)[1].numpy())


def _new_vae():
    """An AutoencoderKLWan of VAE_CONFIG, freshly initialised (latent statistics set after encoding)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(**VAE_CONFIG, latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)


def train_vae(settings: Settings, batches):
    """A small AutoencoderKLWan trained on drawn scenes (``batches.get()`` returns the next step's, as
    ``draw_vae_batches`` puts them): stills first (space), then stills and clips (time).

    The decoder reads the posterior mode, as the pipeline encodes. No KL term: sampling would bury a
    fresh encoder's small latents under unit noise, and the pipeline normalises latents per channel.
    """
    torch.manual_seed(settings.seed)
    vae = _new_vae()
    _start_time_as_identity(vae)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=VAE_LR, betas=(0.9, 0.99), weight_decay=0.0)
    start = time.perf_counter()
    for step in range(settings.vae_steps):
        x = torch.from_numpy(batches.get(timeout=600))  # nothing for 10 min: the drawing process died (see above)
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample
        loss = _reconstruction_loss(y, x)
        _descend(optimizer, loss, _cosine_lr(step, settings.vae_steps, VAE_LR, warmup=20))
        if step % 100 == 0 or step == settings.vae_steps - 1:
            print(f"vae step {step}: loss {loss.item():.4f} ({time.perf_counter() - start:.0f}s)", flush=True)
    return vae.eval()


# -- latents ------------------------------------------------------------------------------------


@dataclass
class Bucket:
    """Training samples whose token ids have one length, so they batch: ``latents [N, C, T, H, W]``."""

    moving: bool
    ids: torch.Tensor  # [N, S]
    uncond_ids: torch.Tensor  # [S_uncond]: the negative branch the pipeline runs for this kind
    latents: torch.Tensor
    sound: torch.Tensor | None  # [N, SOUND_DIM, T_s] for clips: their tones' latents (toy.audio.latents)


def _prompt_ids(tokenizer: PromptTokenizer, caption: str, moving: bool, *, negative: bool) -> list[int]:
    """Token ids exactly as the pipeline builds them for a toy render of this kind."""
    frames = scenes.FRAMES if moving else 1
    spec = PromptSpec(frames=frames, fps=scenes.FPS, height=scenes.SIZE, width=scenes.SIZE)
    return tokenizer.encode(with_metadata(caption, spec, negative=negative), spec.kind)


ENCODE_BATCH = 32


def _scene_batches(rng: np.random.Generator, settings: Settings):
    """The training scenes in batches, ``(moving, scenes, pixels [B, 3, T, H, W])``: stills, then clips."""
    for moving, count in ((False, settings.images), (True, settings.clips)):
        for first in range(0, count, ENCODE_BATCH):
            yield moving, *draw_batch(rng, min(ENCODE_BATCH, count - first), moving=moving)


def _vae_from_state(state: dict):
    vae = _new_vae()
    vae.load_state_dict(state)
    return vae.eval()


@torch.no_grad()
def _encode_odd_batches(state: dict, rng_seed: int, settings: Settings) -> list[torch.Tensor]:
    """The helper process's half of ``encode_scenes``: it draws every batch (the draws share one random
    stream) and encodes the odd ones."""
    vae = _vae_from_state(state)
    return [vae.encode(x).latent_dist.mode()
            for index, (_, _, x) in enumerate(_scene_batches(np.random.default_rng(rng_seed), settings)) if index % 2]


@torch.no_grad()
def encode_scenes(vae, tokenizer: PromptTokenizer, rng_seed: int, settings: Settings, helper: Executor):
    """Encode the training scenes (posterior mode), then normalise latents per channel as the pipeline does.
    The even batches are encoded here, the odd ones by ``helper`` at the same time.

    Returns the buckets and the ``(latents_mean, latents_std)`` to store in ``vae/config.json``.
    """
    odd = helper.submit(_encode_odd_batches, vae.state_dict(), rng_seed, settings)
    drawn = [(moving, batch, None if index % 2 else vae.encode(x).latent_dist.mode())  # mu [B, C, T', H', W']
             for index, (moving, batch, x) in enumerate(_scene_batches(np.random.default_rng(rng_seed), settings))]
    odd_latents = iter(odd.result())
    samples: dict[tuple[bool, int], list] = {}
    for moving, batch, mu in drawn:
        if mu is None:
            mu = next(odd_latents)
        for scene, latent in zip(batch, mu, strict=True):
            ids = _prompt_ids(tokenizer, scene.caption, moving, negative=False)
            samples.setdefault((moving, len(ids)), []).append((ids, latent, scene))
    everything = torch.cat([lat.flatten(1) for group in samples.values() for _, lat, _ in group], dim=1)  # [C, *]
    mean, std = everything.mean(1), everything.std(1)
    buckets = []
    for (moving, _), group in sorted(samples.items()):
        latents = torch.stack([lat for _, lat, _ in group])
        uncond = _prompt_ids(tokenizer, "", moving, negative=True)
        sound = torch.stack([audio.latents(scene) for _, _, scene in group]) if moving else None
        buckets.append(Bucket(moving, torch.tensor([ids for ids, _, _ in group]), torch.tensor(uncond),
                              (latents - mean.view(-1, 1, 1, 1)) / std.view(-1, 1, 1, 1), sound))
    return buckets, [round(v, 5) for v in mean.tolist()], [round(v, 5) for v in std.tolist()]


# -- transformer --------------------------------------------------------------------------------

IMAGE_BATCH, CLIP_BATCH = 32, 12  # about the same number of vision tokens per step
CFG_DROPOUT = 0.1  # share of batches trained on the negative branch, so classifier-free guidance has an uncond
EMA_DECAY = 0.998
SAMPLER_SHIFT = {False: 3.0, True: 10.0}  # the pipeline's flow_shift for images and videos


def _training_sigmas(count: int, moving: bool, generator: torch.Generator) -> torch.Tensor:
    """Half the batch on the sampler's shifted schedule (where sampling spends its steps), half uniform."""
    u = torch.rand(count, generator=generator)
    shifted = flow.shift_sigmas(u, SAMPLER_SHIFT[moving])
    return torch.where(torch.arange(count) % 2 == 0, shifted, u)


def _batch(bucket: Bucket, generator: torch.Generator):
    """(ids [B, S], x0 [B, C, T, H, W], sound x0 [B, D, T_s] or None) drawn from one bucket; a CFG-dropout
    batch uses the negative ids."""
    size = CLIP_BATCH if bucket.moving else IMAGE_BATCH
    index = torch.randint(len(bucket.ids), (size,), generator=generator)
    ids = bucket.ids[index]
    if torch.rand(1, generator=generator).item() < CFG_DROPOUT:
        ids = bucket.uncond_ids.expand(size, -1)
    return ids, bucket.latents[index], None if bucket.sound is None else bucket.sound[index]


def _start_from(model, folder: Path) -> None:
    """A transformer this script trained before (``transformer/``), the sound head excepted if it had none."""
    from safetensors.torch import load_file

    state = {k: v for shard in sorted(folder.glob("*.safetensors")) for k, v in load_file(shard).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    new = [k for k in missing if not k.startswith("audio_")]
    if new or unexpected:
        raise ValueError(f"{folder} is not this toy's transformer: missing {new}, unexpected {unexpected}")
    print(f"transformer starts from {folder} (new: {', '.join(missing) or 'nothing'})", flush=True)


def train_transformer(buckets: list[Bucket], settings: Settings, start: Path | None = None):
    """Flow matching on the encoded scenes (from ``start``'s weights, if given); returns the EMA of the
    weights (what sampling wants)."""
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(settings.seed)
    model = Cosmos3OmniTransformer(**TRANSFORMER_CONFIG)
    if start is not None:
        _start_from(model, start)
    model.set_attn_processor(flow.BatchedMoTAttnProcessor())
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.99), weight_decay=0.01)
    generator = torch.Generator().manual_seed(settings.seed)
    weights = torch.tensor([float(len(b.ids)) for b in buckets])
    start, running = time.perf_counter(), []
    for step in range(settings.steps):
        bucket = buckets[torch.multinomial(weights, 1, generator=generator).item()]
        ids, x0, sound_x0 = _batch(bucket, generator)
        sigma = _training_sigmas(len(ids), bucket.moving, generator)
        noise = torch.randn(x0.shape, generator=generator)
        sound = None if sound_x0 is None else (sound_x0, torch.randn(sound_x0.shape, generator=generator))
        loss = flow.loss(model, ids, x0, sigma, noise, scenes.FPS if bucket.moving else None, sound)
        _descend(optimizer, loss, _cosine_lr(step, settings.steps, settings.lr, warmup=100))
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                e.lerp_(p, 1 - EMA_DECAY)
        running.append(loss.item())
        if step % 100 == 0 or step == settings.steps - 1:
            print(f"transformer step {step}: loss {np.mean(running):.4f} ({time.perf_counter() - start:.0f}s)",
                  flush=True)
            running = []
    return ema


# -- checkpoints --------------------------------------------------------------------------------


def write_sound_tokenizer(folder: Path, settings: Settings) -> None:
    """Train the sound decoder (toy.audio, seeded on its own) and write ``sound_tokenizer/``."""
    audio.train_tokenizer(settings.sound_steps, settings.seed).save_pretrained(str(folder), safe_serialization=True)


def write_bf16(root: Path, vae, transformer) -> None:
    """The rest of the BF16 checkpoint in the published layout (``make_tokenizer`` wrote ``text_tokenizer/``,
    ``write_sound_tokenizer`` ``sound_tokenizer/``)."""
    vae.save_pretrained(str(root / "vae"), safe_serialization=True)
    # Shards small enough that the index exists, as in every published checkpoint.
    save_transformer(transformer, root / "transformer", max_shard_size="4MB")
    write_pipeline_files(root, dict(UNIPC_SCHEDULER), sound=True)


def calibration_requests(seed: int) -> list:
    """Full renders (both CFG branches, every step) of a spread of stills and clips: every colour, shape,
    position and motion appears."""
    rng = np.random.default_rng(seed)
    return [scenes.request(scenes.random_scene(rng, moving=i % 2 == 1), seed=seed + i) for i in range(12)]


def write_fp8(bf16: Path, fp8: Path, seed: int) -> None:
    shutil.rmtree(fp8, ignore_errors=True)
    export_fp8(bf16, fp8, calibration_requests(seed), step_policy=PUBLISHED_STEP_POLICY, max_shard_size="2MB")


def evaluate(root: Path, seeds: int, seed: int) -> tuple[float, float]:
    """Shares of renders whose pixels show the prompt's colours and position / motion, and of clips whose
    tone's pitch names the shape's colour."""
    pipe = Cosmos3Pipeline.from_pretrained(root, device="cpu")
    rng = np.random.default_rng(seed + 1)
    hits = total = pitched = 0
    for moving in (False, True):
        for i in range(seeds):
            scene = scenes.random_scene(rng, moving=moving)
            out = pipe(scenes.request(scene, seed=seed + i))
            hits += measure.matches(scene, measure.read(out.frames))
            total += 1
            if moving:
                pitched += measure.colour_of_pitch(measure.pitch(out.sound, out.sampling_rate)) == scene.colour
    return hits / total, pitched / max(1, seeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "checkpoints" / "toy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vae-steps", type=int, default=1500)
    parser.add_argument("--vae-from", type=Path,
                        help="a VAE this script trained before (its vae/ folder): not retrained")
    parser.add_argument("--transformer-from", type=Path,
                        help="a transformer/ folder this script wrote before: fine-tuned (its sound head added)")
    parser.add_argument("--sound-steps", type=int, default=300)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--clips", type=int, default=3000)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-seeds", type=int, default=20, help="renders per kind in the final check (0: skip)")
    parser.add_argument("--fp8-only", action="store_true", help="keep <out>/bf16; re-export <out>/fp8 from it")
    args = parser.parse_args()
    settings = Settings(args.seed, args.vae_steps, args.sound_steps, args.images, args.clips, args.steps, args.lr,
                        args.eval_seeds)
    start = time.perf_counter()
    bf16, fp8 = args.out / "bf16", args.out / "fp8"
    if args.fp8_only:
        write_fp8(bf16, fp8, settings.seed)
        print(f"wrote {fp8} in {time.perf_counter() - start:.0f}s", flush=True)
        return
    if args.transformer_from and bf16.resolve() in args.transformer_from.resolve().parents:
        parser.error(f"--transformer-from {args.transformer_from} lies in {bf16}, which this run rewrites; "
                     "copy it first")
    vae = None
    if args.vae_from:  # read before the old checkpoint (which may hold it) is removed
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(str(args.vae_from), low_cpu_mem_usage=False).eval()
    for old in (bf16, fp8):
        shutil.rmtree(old, ignore_errors=True)

    tokenizer = make_tokenizer(bf16)
    if vae is None:
        # Forked, not spawned: a spawned process would spend its first ~8 s re-importing this script while the
        # VAE waits for its first batch. Forked first, before the helper pool's threads exist.
        fork = multiprocessing.get_context("fork")
        batches = fork.Queue(maxsize=8)
        drawer = fork.Process(target=draw_vae_batches, args=(settings, batches), daemon=True)
        drawer.start()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as helper:
        sound = helper.submit(write_sound_tokenizer, bf16 / "sound_tokenizer", settings)
        if vae is None:
            vae = train_vae(settings, batches)
            drawer.join()
        # Its own stream (seed + 2), so the scene set is the same whether the VAE was trained now or before.
        buckets, mean, std = encode_scenes(vae, tokenizer, settings.seed + 2, settings, helper)
        sound.result()
    vae.register_to_config(latents_mean=mean, latents_std=std)
    transformer = train_transformer(buckets, settings, args.transformer_from)
    write_bf16(bf16, vae, transformer)
    write_fp8(bf16, fp8, settings.seed)
    print(f"wrote {bf16} and {fp8} in {time.perf_counter() - start:.0f}s", flush=True)
    if settings.eval_seeds:
        accuracy, pitch = evaluate(fp8, settings.eval_seeds, settings.seed)
        print(f"fp8 renders matching their prompt: {accuracy:.0%}, clips whose pitch names the colour: {pitch:.0%} "
              f"({time.perf_counter() - start:.0f}s)")


if __name__ == "__main__":
    main()
