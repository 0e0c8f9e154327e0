"""The Cosmos3 Mixture-of-Transformers (Nano/Super): an UND tower over text, a GEN tower over latents.

Every layer holds both towers' parameters (names as in the diffusers flat checkpoint layout).
UND is causal over text and never sees GEN, so its per-layer K/V are computed once per request
and CFG branch (``encode_text``) and every denoising step runs only the GEN tower against them.
There is no AdaLN: the timestep enters as an additive embedding on noisy frames only.
References: docs/checkpoints.md §1-§3; diffusers ``transformer_cosmos3.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from cosmos3.layers.attention import GEN, UND, MoTAttention
from cosmos3.layers.attention_kernels import AttentionKernels
from cosmos3.layers.embeddings import DomainAwareLinear, TimestepEmbedding, patchify, unpatchify
from cosmos3.layers.linear import Linear
from cosmos3.layers.mlp import GatedMLP
from cosmos3.layers.norm import RMSNorm
from cosmos3.layers.rope import MRoPE, grid_positions, text_positions
from cosmos3.quant import UNQUANTIZED, get_quant_method
from cosmos3.quant.step_precision import StepPrecision
from cosmos3.rules.config import Cosmos3Config

VAE_TEMPORAL_COMPRESSION = 4  # Wan 2.2 VAE: 4 pixel frames per latent frame (fps modulation uses it)


@dataclass
class UndCache:
    """Per-layer UND K (post-norm, post-RoPE) and V, each ``[S_und, nkv, hd]``, for one prompt."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int  # S_und: the text positions 0..S_und-1; vision starts at S_und + 15000
    # int32 [1] on the device: how many leading rows of keys/values GEN attention skips (a CUDA graph's static
    # cache holds any prompt up to its rows, right-aligned: cosmos3/cuda_graphs.py); None: every row is the prompt's
    skip: torch.Tensor | None = None


class LayoutKey(NamedTuple):
    latent_shape: tuple[int, int, int, int]
    und_len: int
    fps: float | None
    condition_frames: tuple[int, ...]
    sound_frames: int | None


@dataclass(frozen=True)
class GenLayout:
    """Shape-only facts of a GEN evaluation: the same for every step of a render."""

    key: LayoutKey
    latent_shape: tuple[int, int, int, int]  # [C, T, H, W]
    grid: tuple[int, int, int]  # patch grid (T, Hp, Wp)
    noisy: torch.Tensor  # [T_noisy] long: latent frames that get the timestep embedding
    cos: torch.Tensor  # [N_gen, hd] RoPE of the GEN tokens (vision, then sound)
    sin: torch.Tensor


@dataclass
class GenOutput:
    vision: torch.Tensor  # velocity [C, T, H, W], zero at condition frames
    sound: torch.Tensor | None = None  # velocity [sound_dim, T_s]
    # The decoder stack's input and its normed output, each [N_gen, H]: what a step cache keeps the difference of
    # (cosmos3.step_cache). From a CUDA graph they are its buffers, overwritten by its next replay. None when the
    # stack did not run (a cached step).
    stack: tuple[torch.Tensor, torch.Tensor] | None = None


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 block, once per tower; both towers meet only inside attention."""

    def __init__(self, config: Cosmos3Config, *, split: bool, make_linear, dtype: torch.dtype,
                 attention: AttentionKernels):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps, dtype)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype)
        self.input_layernorm_moe_gen = RMSNorm(h, eps, dtype)
        self.post_attention_layernorm_moe_gen = RMSNorm(h, eps, dtype)
        self.self_attn = MoTAttention(
            hidden_size=h, num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim, eps=eps, split_qkv=split, make_linear=make_linear("self_attn"), dtype=dtype,
            kernels=attention,
        )
        mlp_args = dict(hidden_size=h, intermediate_size=config.intermediate_size, split_gate_up=split)
        self.mlp = GatedMLP(**mlp_args, make_linear=make_linear("mlp"))
        self.mlp_moe_gen = GatedMLP(**mlp_args, make_linear=make_linear("mlp_moe_gen"))

    # Each tower's residual add is deferred into the next norm (add_rms_norm): a layer takes the stream ``x``
    # ``[S, H]`` with the previous layer's MLP output ``delta`` not yet added (None in the first layer) and
    # returns the same pair, so a stream's adds and norms are one kernel each.

    def forward_und(self, x: torch.Tensor, delta: torch.Tensor | None, cos, sin, *, kv_only: bool = False):
        """UND stream; returns (stream, MLP output, K, V), the first two None when ``kv_only``."""
        x, h = residual_norm(self.input_layernorm, x, delta, self.self_attn.input_scale(UND))
        attn, k, v = self.self_attn.und(h, cos, sin)
        if kv_only:  # the last layer's UND output is never read: GEN only needs its K/V
            return None, None, k, v
        x, h = self.post_attention_layernorm.add(x, attn, scale=self.mlp.input_scale())
        return x, self.mlp(h), k, v

    def forward_gen(self, x: torch.Tensor, delta: torch.Tensor | None, cos, sin, k_und: torch.Tensor,
                    v_und: torch.Tensor, skip: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """GEN stream; returns (stream, MLP output)."""
        x, h = residual_norm(self.input_layernorm_moe_gen, x, delta, self.self_attn.input_scale(GEN))
        attn = self.self_attn.gen(h, cos, sin, k_und, v_und, skip)
        x, h = self.post_attention_layernorm_moe_gen.add(x, attn, scale=self.mlp_moe_gen.input_scale())
        return x, self.mlp_moe_gen(h)


def residual_norm(norm: RMSNorm, x: torch.Tensor, delta: torch.Tensor | None,
                  scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, norm of it)``; a first layer has nothing to add."""
    if delta is None:
        return x, norm(x, scale=scale)
    return norm.add(x, delta, scale=scale)


class Cosmos3Transformer(nn.Module):
    """``velocity(input_ids, latents, timestep)``: the flow-matching velocity of one sample.

    ``precision`` picks the decoder projections' quant method and topology: ``bf16`` and
    ``fp8-dynamic`` fuse Q/K/V and gate/up per tower; ``fp8-static`` keeps them split and runs
    W8A8 exactly on ``fp8_modules`` (the checkpoint's FP8 Linears, ``checkpoint_header.fp8_modules``,
    proj_in / proj_out / time_embedder included when it quantized them), the rest high precision.
    ``attention`` (``auto``, ``bf16``, ``fp8``) picks the attention kernels (attention_kernels.py).
    """

    def __init__(self, config: Cosmos3Config, *, precision: str = "bf16", dtype: torch.dtype = torch.bfloat16,
                 fp8_modules: frozenset[str] = frozenset(), attention: str = "auto", fp8_accumulation: str = "fast"):
        super().__init__()
        self.config = config
        self.precision = precision
        self.fp8_accumulation = None if precision == "bf16" else fp8_accumulation  # how its FP8 GEMMs sum
        self.dtype = dtype
        # The precision a step runs: the step controller sets it, the CUDA graphs read it, the GEN linears and the
        # attention obey it.
        self.step_precision = StepPrecision()
        self.attention = AttentionKernels(attention, config.head_dim, self.step_precision)
        self.step_controller = None  # set by the loader when a step policy is in force
        # The last layer's UND MLP output is never read (GEN needs only its K/V), so it is
        # skipped; FP8 calibration turns this off so every projection sees activations.
        self.skip_unread_und_mlp = True
        self.cuda_graphs = None  # a GenGraphs once cosmos3.cuda_graphs.enable_cuda_graphs(model) is called
        self._layouts: dict[tuple, GenLayout] = {}
        method = get_quant_method(precision, fp8_accumulation)
        split = precision == "fp8-static"

        def make_linear_in(prefix: str, *, top: bool = False, linear_dtype: torch.dtype = dtype):
            def make_linear(name: str, in_features: int, out_features, shard_keys=None) -> Linear:
                full_name = f"{prefix}.{name}".lstrip(".")
                if split:  # static FP8 follows the checkpoint, module by module
                    chosen = method if full_name in fp8_modules else UNQUANTIZED
                else:  # dynamic FP8 quantizes the decoder projections only
                    chosen = UNQUANTIZED if top else method
                return Linear(in_features, out_features, quant_method=chosen, dtype=linear_dtype,
                              shard_keys=shard_keys, bias=top)
            return make_linear

        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h, dtype=dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(config, split=split, make_linear=lambda sub, i=i: make_linear_in(f"layers.{i}.{sub}"),
                         dtype=dtype, attention=self.attention)
            for i in range(config.num_hidden_layers)
        )
        self.norm_moe_gen = RMSNorm(h, config.rms_norm_eps, dtype)
        top = make_linear_in("", top=True)
        self.proj_in = top("proj_in", config.patch_latent_dim, h)  # vae2llm in the legacy layout
        self.proj_out = top("proj_out", h, config.patch_latent_dim)  # llm2vae
        self.time_embedder = TimestepEmbedding(h, make_linear_in("time_embedder", top=True, linear_dtype=torch.float32))
        self.rotary_emb = MRoPE(config.head_dim, config.rope_theta, config.rope_axes_dim)
        if config.sound_gen:
            self.audio_proj_in = top("audio_proj_in", config.sound_dim, h)
            self.audio_proj_out = top("audio_proj_out", h, config.sound_dim)
            self.audio_modality_embed = nn.Parameter(torch.zeros(h, dtype=dtype))
        if config.action_gen:
            # Loaded so no checkpoint weight is silently dropped; no task drives actions yet.
            domains = config.num_embodiment_domains
            self.action_proj_in = DomainAwareLinear(config.action_dim, h, domains, dtype)
            self.action_proj_out = DomainAwareLinear(h, config.action_dim, domains, dtype)
            self.action_modality_embed = nn.Parameter(torch.zeros(h, dtype=dtype))
        self.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # ---------------------------------------------------------------- UND tower

    @torch.no_grad()
    def encode_text(self, input_ids: torch.Tensor) -> UndCache:
        """Run the UND tower once over ``input_ids`` ``[S]`` and keep every layer's K/V."""
        ids = input_ids.to(self.device).reshape(-1)
        if self.cuda_graphs is not None:
            return self.cuda_graphs.und(ids)
        return self.und(ids)

    def und_rotary(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The UND tower's RoPE tables ``[S, hd]`` for ``length`` text tokens (built on the host)."""
        return self.rotary_emb(text_positions(length), self.dtype)

    def und(self, ids: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> UndCache:
        """The UND tower over device ids ``[S]``. Handed its RoPE tables (``und_rotary``), it touches device
        tensors only (no host reads: CUDA-graph capturable)."""
        cos, sin = self.und_rotary(ids.numel()) if rotary is None else rotary
        x, delta = self.embed_tokens(ids), None  # [S, H]
        keys, values = [], []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, delta, k, v = layer.forward_und(x, delta, cos, sin, kv_only=self.skip_unread_und_mlp and i == last)
            keys.append(k)
            values.append(v)
        return UndCache(keys, values, ids.numel())

    # ---------------------------------------------------------------- GEN tower

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor | None,
        latents: torch.Tensor,
        timestep: float | torch.Tensor,
        *,
        fps: float | None = None,
        condition_frames: Iterable[int] = (),
        sound_latents: torch.Tensor | None = None,
        und_cache: UndCache | None = None,
        stack_residual: torch.Tensor | None = None,
    ) -> GenOutput:
        """One denoising evaluation. ``latents`` ``[C, T, H, W]``; ``sound_latents`` ``[sound_dim, T_s]``.

        Without ``und_cache`` the UND tower is recomputed from ``input_ids`` (equal results). With
        ``stack_residual`` ``[N_gen, H]`` the decoder stack does not run: its output is its input plus that
        residual (a step cache's cached step: ``cached_gen``, replayed from a graph where GEN passes are).
        """
        if und_cache is None:
            und_cache = self.encode_text(input_ids)
        t = latents.shape[1]
        cond = tuple(sorted({int(i) for i in condition_frames if 0 <= int(i) < t}))
        sound_frames = None if sound_latents is None else sound_latents.shape[1]
        layout = self.gen_layout(tuple(latents.shape), und_cache.length, fps, cond, sound_frames)
        latents = latents.to(self.device, self.dtype)
        if sound_latents is not None:
            sound_latents = sound_latents.to(self.device, self.dtype)
        step_t = self._timestep_tensor(timestep)
        if stack_residual is not None:
            if self.cuda_graphs is not None:
                return self.cuda_graphs.run_cached(layout, latents, step_t, stack_residual, sound_latents)
            return self.cached_gen(layout, latents, step_t, stack_residual, sound_latents)
        if self.cuda_graphs is not None:
            return self.cuda_graphs.run(layout, latents, step_t, und_cache, sound_latents)
        return self.gen(layout, latents, step_t, und_cache, sound_latents)

    def gen_layout(self, latent_shape: tuple[int, int, int, int], und_len: int, fps: float | None,
                   condition_frames: tuple[int, ...], sound_frames: int | None) -> GenLayout:
        """What a GEN evaluation needs beyond tensors, built once per shape and reused every step."""
        key = LayoutKey(latent_shape, und_len, fps, condition_frames, sound_frames)
        if key not in self._layouts:
            if len(self._layouts) >= 16:  # a render uses one or two; bound it across requests
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[key] = self._build_layout(key)
        return self._layouts[key]

    def patch_grid(self, latent_shape: tuple[int, int, int, int]) -> tuple[int, int, int]:
        """The GEN tokens' grid ``(T, Hp, Wp)`` of latents ``[C, T, H, W]`` (a partial patch at an edge is a token)."""
        _, t, h, w = latent_shape
        p = self.config.latent_patch_size
        return t, -(-h // p), -(-w // p)

    def prepare_gen(self, latent_shape: tuple[int, int, int, int], sound_frames: int | None) -> None:
        """Before a job's GEN passes over ``latent_shape`` (and ``sound_frames`` sound latents): the CUDA graphs
        keep or free what only their length needs (cuda_graphs.GenGraphs.prepare)."""
        if self.cuda_graphs is not None:
            self.cuda_graphs.prepare(math.prod(self.patch_grid(latent_shape)) + (sound_frames or 0))

    def _build_layout(self, key) -> GenLayout:
        latent_shape, und_len, fps, cond, sound_frames = key
        t = latent_shape[1]
        grid = self.patch_grid(latent_shape)
        offset = und_len + self.config.unified_3d_mrope_temporal_modality_margin
        vision_fps = fps if self.config.enable_fps_modulation else None
        positions = [grid_positions(grid, offset, fps=vision_fps, base_fps=self.config.base_fps,
                                    temporal_compression=VAE_TEMPORAL_COMPRESSION)]
        if sound_frames is not None:  # sound shares the vision temporal offset ("temporal siblings")
            sound_fps = self.config.sound_latent_fps if self.config.enable_fps_modulation else None
            positions.append(grid_positions((sound_frames, 1, 1), offset, fps=sound_fps,
                                            base_fps=self.config.base_fps, temporal_compression=1))
        cos, sin = self.rotary_emb(torch.cat(positions, dim=1), self.dtype)  # [N_gen, hd] each
        noisy = torch.tensor([i for i in range(t) if i not in cond], dtype=torch.long, device=self.device)
        return GenLayout(key, latent_shape, grid, noisy, cos, sin)

    def cached_gen(self, layout: GenLayout, latents: torch.Tensor, step_t: torch.Tensor, residual: torch.Tensor,
                   sound_latents: torch.Tensor | None = None) -> GenOutput:
        """A step cache's cached pass: the GEN stream's embedding, the decoder stack's stand-in ``residual``
        ``[N_gen, H]`` added, the readout. Device tensors only (no host reads: CUDA-graph capturable)."""
        x = self._embed(layout, latents, step_t, sound_latents)  # [N_gen, H]
        return self._read(layout, x + residual, sound_latents is not None)

    def gen(self, layout: GenLayout, latents: torch.Tensor, step_t: torch.Tensor, und_cache: UndCache,
            sound_latents: torch.Tensor | None = None) -> GenOutput:
        """The GEN tower on device tensors only (no host reads: CUDA-graph capturable)."""
        x_in = self._embed(layout, latents, step_t, sound_latents)  # [N_gen, H]
        x, delta = x_in, None
        for layer, k_und, v_und in zip(self.layers, und_cache.keys, und_cache.values, strict=True):
            x, delta = layer.forward_gen(x, delta, layout.cos, layout.sin, k_und, v_und, und_cache.skip)
        _, x = residual_norm(self.norm_moe_gen, x, delta, None)
        out = self._read(layout, x, sound_latents is not None)
        out.stack = (x_in, x)
        return out

    def _embed(self, layout: GenLayout, latents: torch.Tensor, step_t: torch.Tensor,
               sound_latents: torch.Tensor | None) -> torch.Tensor:
        """The GEN stream ``[N_gen, H]``: vision patches, then sound; the timestep embedding on noisy tokens only."""
        t, (_, hp, wp), p = layout.latent_shape[1], layout.grid, self.config.latent_patch_size
        patches, _ = patchify(latents, p)  # [T*Hp*Wp, p*p*C]
        tokens = self.proj_in(patches).view(t, hp * wp, -1)  # [T, Hp*Wp, H]
        t_emb = self.time_embedder(step_t * self.config.timestep_scale)[0].to(self.dtype)  # [H], fp32 inside
        tokens[layout.noisy] += t_emb
        tokens = tokens.reshape(t * hp * wp, -1)
        if sound_latents is None:
            return tokens
        # Sound tokens follow vision in the GEN stream; all are noisy.
        return torch.cat([tokens, self.audio_proj_in(sound_latents.t()) + self.audio_modality_embed + t_emb])

    def _read(self, layout: GenLayout, x: torch.Tensor, sound: bool) -> GenOutput:
        """Velocities from the normed stack output ``x [N_gen, H]``, read at noisy vision tokens only (condition
        frames stay zero) and at the sound tokens."""
        c, t, h, w = layout.latent_shape
        _, hp, wp = layout.grid
        n_vision = t * hp * wp
        frames = x[:n_vision].view(t, hp * wp, -1)[layout.noisy]  # [T_noisy, Hp*Wp, H]
        pred = self.proj_out(frames.reshape(-1, frames.shape[-1]))
        velocity = torch.zeros((c, t, h, w), dtype=self.dtype, device=self.device)
        velocity[:, layout.noisy] = unpatchify(pred, (len(layout.noisy), hp, wp), self.config.latent_patch_size,
                                               (h, w))
        return GenOutput(velocity, self.audio_proj_out(x[n_vision:]).t() if sound else None)

    def velocity(self, input_ids, latents, timestep, fps=None, condition_frames=(), und_cache=None) -> torch.Tensor:
        """The public entry point: the vision velocity ``[C, T, H, W]``, zero at ``condition_frames``."""
        return self.forward(input_ids, latents, timestep, fps=fps, condition_frames=condition_frames,
                            und_cache=und_cache).vision

    def _timestep_tensor(self, timestep: float | torch.Tensor) -> torch.Tensor:
        """Scheduler timestep (0..1000) as an fp32 ``[1]`` device tensor, written without a host sync."""
        if isinstance(timestep, torch.Tensor) and timestep.device == self.device:
            return timestep.reshape(1).float()
        return torch.full((1,), float(timestep), dtype=torch.float32, device=self.device)

    # ---------------------------------------------------------------- step precision

    def set_denoising_step(self, step: int, num_steps: int) -> None:
        """Pick step ``step`` of ``num_steps``'s precision (linears and attention), once, before both CFG passes."""
        if self.step_controller is not None:
            self.step_controller.set_step(step, num_steps)

    def step_policy_info(self) -> dict | None:
        return None if self.step_controller is None else self.step_controller.describe()

    def finish_loading(self) -> None:
        """Once every projection is final (never in forward): checks load-time invariants and makes what derives
        from the loaded tensors (packed groups' column scales)."""
        for i, layer in enumerate(self.layers):
            layer.self_attn.finish_loading(f"layers.{i}.self_attn")
            layer.mlp.finish_loading(f"layers.{i}.mlp")
            layer.mlp_moe_gen.finish_loading(f"layers.{i}.mlp_moe_gen")
