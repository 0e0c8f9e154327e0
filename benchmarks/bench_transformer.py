"""Per-step time and peak memory of the Cosmos3 transformer on Nano-shaped layers (needs CUDA).

Variants, measured side by side in one run on the same random weights:
  diffusers       diffusers' Cosmos3OmniTransformer (recomputes the UND tower every call)
  bf16 no-cache   ours, BF16 fused topology, UND tower recomputed every step
  bf16            ours, BF16 fused topology, UND K/V cached (only GEN runs per step)
  fp8 split       ours, static FP8 W8A8, Q/K/V and gate/up split, shared input quantization
  fp8 fused       static FP8 forced onto the fused topology (one max(scale) per fused weight,
                  the layout TensorRT-LLM had before PR #17476); a speed baseline only
  w8a16 step      the fp8 model on an edge step of the checkpoint's step policy (BF16 attention there)
  fp8 attn        the fp8 split model with attention="fp8" (cuDNN sdpa_fp8 where the GEN pass is long
                  enough for it to pay, BF16 below: the attention column names the kernel)
Our variants run eager and replayed from CUDA graphs (``cosmos3.cuda_graphs.enable_cuda_graphs(model)``). Per
variant: step time (median, CUDA events), the attention kernel of its GEN steps, GEN-linear time
and attention time measured alone (their share of the step), weight memory of the decoder
projections, peak memory of a step over the resident weights, and memory left behind after the
step (a W8A16 step must leave none). ``--no-diffusers`` also builds the random checkpoint without
diffusers (the GPU machine has none); ``--variants`` / ``--modes`` keep a 36-layer run short.

``--checkpoint ROOT`` measures the transformers of ``ROOT/bf16`` and ``ROOT/fp8`` (the checkpoints
``bench_render.py write`` makes) instead of building and exporting random layers: a 36-layer run then
skips the ModelOpt calibration and export of a 16B model (``--layers`` is the checkpoint's).

``--sound`` (video shapes): the layers also carry Nano's sound head, and every variant of ours is
measured again with the clip's sound tokens in the GEN stream (720p / 189 frames at 24 fps = 7.875 s
= 197 sound latent frames at 48 kHz / 1920), so a second table gives the per-step cost of sound.

    python -m benchmarks.bench_transformer --layers 4 --tokens 1024 44160
    python -m benchmarks.bench_transformer --layers 4 --tokens 44160 --sound --no-diffusers
    python -m benchmarks.bench_transformer --layers 36 --no-diffusers --modes graphs \\
        --variants bf16 "fp8 split" "fp8 attn" "w8a16 step"
    python -m benchmarks.bench_transformer --checkpoint /tmp/nano --modes graphs --variants bf16 "fp8 split" "fp8 attn"
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.common import timed
from cosmos3.checkpoint.fp8_export import PUBLISHED_STEP_POLICY, export, quantize
from cosmos3.checkpoint.loader import build_transformer, load_transformer
from cosmos3.checkpoint.weights import SKIPPED, TensorDict
from cosmos3.cuda_graphs import enable_cuda_graphs, warmed_capture
from cosmos3.diffusers_model import reference_forward
from cosmos3.layers.linear import Linear, quantize_shared_input
from cosmos3.quant import STATIC_FP8
from cosmos3.rules.config import Cosmos3Config, SoundConfig
from testbed.random_weights import random_checkpoint

# GEN tokens -> latent [C, T, H, W]: 1,024 = T2I 1024x1024; 44,160 = 720p, 189 frames (45 rows pad to 46).
LATENT_SHAPES = {1024: (48, 1, 64, 64), 44160: (48, 48, 45, 80)}
# Nano's sound: 64-d latents, 25 per second (the published AVAE decodes 48 kHz over a 1920-sample hop).
NANO_SOUND = SoundConfig(sound_dim=64, latent_fps=25.0, sampling_rate=48000, hop_size=1920, channels=2)
VARIANTS = ("bf16", "fp8 split", "fp8 fused", "w8a16 step", "fp8 attn")


def nano_config(layers: int, vocab: int, sound: bool = False) -> dict:
    return dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=vocab, latent_channel=48, latent_patch_size=2,
                patch_latent_dim=192, rope_theta=5e6,
                rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
                sound_gen=sound, sound_dim=NANO_SOUND.sound_dim if sound else None)


def peak_over_resident(fn) -> tuple[float, float]:
    """(peak GiB above what was allocated before ``fn``, GiB still allocated after it)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    gib = 2**30
    return (torch.cuda.max_memory_allocated() - before) / gib, (torch.cuda.memory_allocated() - before) / gib


def projection_gib(model) -> float:
    tensors = [p for m in model.modules() if isinstance(m, Linear) for p in m.parameters()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30


def gen_linears(model, x: torch.Tensor) -> None:
    """Every GEN-tower projection of a step (Q/K/V, O, gate/up, swiglu, down) on ``x`` ``[N, H]``."""
    for layer in model.layers:
        attn = layer.self_attn
        if attn.split_qkv:
            projections = [attn.add_q_proj, attn.add_k_proj, attn.add_v_proj]
            x_in = quantize_shared_input(x, projections)
            for proj in projections:
                proj(x_in)
        else:
            attn.add_qkv_proj(x)
        attn.to_add_out(x[:, : attn.num_heads * attn.head_dim])
        layer.mlp_moe_gen(x)


def attention_only(model, n_gen: int, n_und: int):
    """Every layer's GEN attention, with the kernel the model's GEN step runs now."""
    cfg = model.config
    q = torch.randn(n_gen, cfg.num_attention_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(n_gen + n_und, cfg.num_key_value_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)

    def run():
        for _ in model.layers:
            model.attention.gen(q, kv, kv)
    return run


def fuse_static_fp8(bf16_model, fp8_model) -> None:
    """Baseline: give ``bf16_model``'s fused projections the FP8 tensors of ``fp8_model`` under one max scale."""
    for name, fused in bf16_model.named_modules():
        if not isinstance(fused, Linear) or not name.startswith("layers."):  # decoder projections only
            continue
        parent = name.rsplit(".", 1)[0]
        shards = [fp8_model.get_submodule(f"{parent}.{k}" if k else name) for k in fused.shard_keys]
        if shards[0].quant_method is not STATIC_FP8:  # kept high precision in the FP8 checkpoint (proj_in, ...)
            continue
        scale = torch.stack([s.weight_scale for s in shards]).max()
        weight = torch.cat([(s.weight.float() * s.weight_scale / scale).clamp(-448, 448) for s in shards])
        fused.weight = torch.nn.Parameter(weight.to(torch.float8_e4m3fn), False)
        fused.weight_scale = torch.nn.Parameter(scale, False)
        fused.input_scale = torch.nn.Parameter(shards[0].input_scale.clone(), False)
        fused.out_dtype = torch.bfloat16
        fused.quant_method = STATIC_FP8  # apply() only needs the tensors; the fused layout is the point


def modelopt_fp8(cfg: dict, state: dict, vocab: int):
    """Our static FP8 model of ``state``: ModelOpt's export (cosmos recipe) of diffusers' model over the same
    weights, calibrated on one T2I-sized pass."""
    from diffusers import Cosmos3OmniTransformer

    with torch.device("cuda"):
        model = Cosmos3OmniTransformer(**cfg).to(torch.bfloat16).eval()
    model.time_embedder.float()
    # A state made by our own model lacks the tensors our loader skips (lm_head, the UND final norm);
    # diffusers keeps its own init for those, which generation never reads.
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= set(SKIPPED), f"missing {missing}, unexpected {unexpected}"
    ids = torch.randint(0, vocab, (512,), device="cuda")
    quantize(model, lambda m: reference_forward(m, ids, torch.randn(48, 1, 64, 64, device="cuda").bfloat16(), 500.0))
    with tempfile.TemporaryDirectory() as tmp:
        export(model, tmp, step_policy=PUBLISHED_STEP_POLICY)
        del model
        return load_transformer(tmp, device="cuda", dtype=torch.bfloat16)


def build_models(layers: int, vocab: int, with_diffusers: bool, sound: bool, with_fused: bool):
    torch.manual_seed(0)
    cfg = nano_config(layers, vocab, sound)
    reference = None
    if with_diffusers:
        from diffusers import Cosmos3OmniTransformer

        with torch.device("cuda"):  # initialise on the GPU: a CPU init of billions of params takes minutes
            reference = Cosmos3OmniTransformer(**cfg).to(torch.bfloat16).eval()
        reference.time_embedder.float()
        with torch.no_grad():
            for name, p in reference.named_parameters():
                p.copy_((1.0 + 0.05 * torch.randn_like(p)) if "norm" in name else 0.02 * torch.randn_like(p))
        state = {k: v for k, v in reference.state_dict().items()}
    else:
        state = random_checkpoint(cfg)
    config = Cosmos3Config.from_dict(cfg)
    bf16 = build_transformer(config, TensorDict(state), device="cuda", dtype=torch.bfloat16)
    fp8 = modelopt_fp8(cfg, state, vocab)
    fused = None
    if with_fused:
        fused = build_transformer(config, TensorDict(state), device="cuda", dtype=torch.bfloat16)
        fuse_static_fp8(fused, fp8)
    del state
    return reference, bf16, fp8, fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 44160], choices=sorted(LATENT_SHAPES))
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192, help="embedding rows (not on the per-step path)")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-diffusers", action="store_true")
    parser.add_argument("--checkpoint", type=Path, help="a folder with bf16/ and fp8/ checkpoints to measure")
    parser.add_argument("--sound", action="store_true", help="also measure each variant with the clip's sound tokens")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--modes", nargs="+", default=["eager", "graphs"], choices=["eager", "graphs"])
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    if args.checkpoint:
        if "fp8 fused" in args.variants or not args.no_diffusers:
            parser.error("--checkpoint measures our bf16 and fp8 models only: add --no-diffusers, drop 'fp8 fused'")
        reference, fused = None, None
        bf16, fp8 = (load_transformer(args.checkpoint / variant, device="cuda", dtype=torch.bfloat16)
                     for variant in ("bf16", "fp8"))
        args.layers, args.vocab = bf16.config.num_hidden_layers, bf16.config.vocab_size
    else:
        reference, bf16, fp8, fused = build_models(args.layers, args.vocab, not args.no_diffusers, args.sound,
                                                   "fp8 fused" in args.variants)
    print(f"GPU {props.name}, sm_{props.major}{props.minor}, CUDA {torch.version.cuda}, torch {torch.__version__}; "
          f"Nano-shaped layers: {args.layers} (of 36), text tokens {args.text_tokens}"
          + (f"; checkpoints {args.checkpoint}/{{bf16,fp8}}" if args.checkpoint else ""))
    print(f"decoder projection weights: bf16 {projection_gib(bf16):.2f} GiB, fp8 split {projection_gib(fp8):.2f} GiB "
          f"({projection_gib(fp8) / projection_gib(bf16):.2f}x)")
    ids = torch.randint(0, args.vocab, (args.text_tokens,), device="cuda")
    for n in args.tokens:
        rows = run_shape(n, ids, reference, bf16, fp8, fused, args)
        print_table(n, rows)
        if any(SOUND in name for name in rows):
            print_sound_table(n, rows)


def graphed(fn):
    """``fn`` captured once in a CUDA graph; the returned callable replays it."""
    return warmed_capture(fn)[0].replay


SOUND = " +sound"


def run_shape(n, ids, reference, bf16, fp8, fused, args) -> dict:
    latents = torch.randn(LATENT_SHAPES[n], device="cuda", dtype=torch.bfloat16)
    video = latents.shape[1] > 1
    fps = 24.0 if video else None
    sound = None
    if args.sound and video:  # the clip's sound latents: [64, T_s], T_s from its duration
        frames = (latents.shape[1] - 1) * 4 + 1
        sound = torch.randn(NANO_SOUND.sound_dim, NANO_SOUND.latent_frames(frames, fps), device="cuda",
                            dtype=torch.bfloat16)
    caches = {m: m.encode_text(ids) for m in (bf16, fp8, fused) if m is not None}

    def step(model, cached=True, sound=None):
        cache = caches[model] if cached else None
        return lambda: model(ids, latents, 500.0, fps=fps, und_cache=cache, sound_latents=sound)

    models = {"bf16": bf16, "fp8 split": fp8, "fp8 fused": fused, "w8a16 step": fp8, "fp8 attn": fp8}
    ours = {name: models[name] for name in VARIANTS if name in args.variants}
    rows = {}
    if "eager" in args.modes:
        if reference is not None:
            from testbed.reference import reference_forward

            rows["diffusers"] = measure(lambda: reference_forward(reference, ids, latents, 500.0, fps=fps), None, args)
        rows["bf16 no-cache"] = measure(step(bf16, cached=False), None, args)
    streams = [("", None)] + ([(SOUND, sound)] if sound is not None else [])
    for mode in args.modes:
        for extra, tokens in streams:
            n_gen = n + (0 if tokens is None else tokens.shape[1])
            x = torch.randn(n_gen, bf16.config.hidden_size, device="cuda", dtype=torch.bfloat16)
            for name, model in ours.items():
                # The edge step of a 35-step schedule runs W8A16 (and BF16 attention); the middle one W8A8.
                fp8.set_denoising_step(0 if name == "w8a16 step" else 17, 35)
                if name == "fp8 attn":
                    fp8.attention.use("fp8")
                if mode == "graphs" and model.cuda_graphs is None:
                    enable_cuda_graphs(model)
                linears = lambda model=model: gen_linears(model, x)  # noqa: E731
                linears = graphed(linears) if mode == "graphs" else linears
                attention = attention_only(model, n_gen, ids.numel())
                attention = graphed(attention) if mode == "graphs" else attention
                rows[f"{name}{extra} ({mode})"] = measure(step(model, sound=tokens), linears, args,
                                                          timed(attention, args.iters, args.warmup),
                                                          model.attention.gen_kernel("cuda", n_gen))
                fp8.attention.use("auto")
    for model in ours.values():
        model.cuda_graphs = None
    fp8.set_denoising_step(17, 35)
    return rows


@torch.no_grad()
def measure(step, linears, args, attention_ms=float("nan"), kernel: str = "") -> dict:
    step_ms = timed(step, args.iters, args.warmup)
    peak, left = peak_over_resident(step)
    linear_ms = timed(linears, args.iters, args.warmup) if linears else float("nan")
    return dict(step=step_ms, linears=linear_ms, attention=attention_ms, peak=peak, left=left, kernel=kernel)


def print_sound_table(n: int, rows: dict) -> None:
    print(f"\n### sound tokens' per-step cost at {n:,} GEN tokens (each variant silent vs with the clip's sound)")
    print("| variant | silent step ms | with sound ms | extra ms | extra |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        if SOUND in name:
            silent = rows[name.replace(SOUND, "")]
            print(f"| {name.replace(SOUND, '')} | {silent['step']:.2f} | {r['step']:.2f} "
                  f"| {r['step'] - silent['step']:+.2f} | {r['step'] / silent['step'] - 1:+.1%} |")


def print_table(n: int, rows: dict) -> None:
    print(f"\n### {n:,} GEN tokens per step; ratios against our bf16 (else the first row) in the same mode")
    print("| variant | attention | step ms | vs bf16 | GEN linears ms | linears vs bf16 | linears share "
          "| attention ms | attention share | step peak GiB | left after step GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        mode = "graphs" if "graphs" in name else "eager"
        base = rows.get(f"bf16 ({mode})") or next(r for n, r in rows.items() if mode in n)
        print(f"| {name} | {r['kernel']} | {r['step']:.2f} | {base['step'] / r['step']:.2f}x | {r['linears']:.2f} "
              f"| {base['linears'] / r['linears']:.2f}x | {r['linears'] / r['step']:.0%} "
              f"| {r['attention']:.2f} | {r['attention'] / r['step']:.0%} | {r['peak']:.2f} | {r['left']:.3f} |")


if __name__ == "__main__":
    main()
