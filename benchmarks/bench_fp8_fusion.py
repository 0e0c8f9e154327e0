"""What a max(scale) fusion would do to a static FP8 checkpoint (TensorRT-LLM PR #17476).

Fusing Q/K/V (or gate/up) under one per-tensor scale keeps ``s = max(s_i)`` and re-rounds every
other shard: ``q_i' = e4m3(s_i * q_i / s)``. We never do that; this script measures what it
would cost on a calibrated checkpoint: the share of fused groups and shards whose bytes change,
and the added error relative to the numerical floor.

* floor: RMS error the calibrated FP8 weight already carries against the BF16 weight it was
  exported from (``s_i q_i - W``), i.e. the error ModelOpt's one rounding introduced;
* added: RMS of the extra change a fusion makes (``s q_i' - s_i q_i``) on altered shards;
* and at the output: the RMS change of ``y = x W^T`` (x ~ N(0, 1), fp32 maths) relative to the
  floor of a BF16 output, the rounding every exact implementation already carries.

Usage: ``python -m benchmarks.bench_fp8_fusion`` (builds and calibrates a model itself), or
``--fp8 CKPT --bf16 CKPT`` for an exported pair (e.g. the toy checkpoint).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

import torch

from cosmos3 import ops
from cosmos3.checkpoint.weights import CheckpointFiles
from cosmos3.rules.checkpoint_header import transformer_dir

GROUPS = {
    "UND qkv": ("self_attn.to_q", "self_attn.to_k", "self_attn.to_v"),
    "GEN qkv": ("self_attn.add_q_proj", "self_attn.add_k_proj", "self_attn.add_v_proj"),
    "UND gate/up": ("mlp.gate_proj", "mlp.up_proj"),
    "GEN gate/up": ("mlp_moe_gen.gate_proj", "mlp_moe_gen.up_proj"),
}


def rms(t: torch.Tensor) -> float:
    return t.float().pow(2).mean().sqrt().item()


def analyse(fp8: CheckpointFiles, bf16: CheckpointFiles) -> dict:
    layers = sorted({int(k.split(".")[1]) for k in fp8.keys() if k.startswith("layers.")})
    stats = {"groups": 0, "groups_altered": 0, "shards": 0, "shards_altered": 0, "ratios": [], "output": []}
    x = torch.randn(256, fp8.shape_of(f"layers.{layers[0]}.self_attn.to_q.weight")[1],
                    generator=torch.Generator().manual_seed(0))
    for layer in layers:
        for members in GROUPS.values():
            names = [f"layers.{layer}.{m}" for m in members]
            if not all(f"{n}.weight_scale" in fp8 for n in names):
                continue  # a member on the ignore list: the group is not static FP8
            scales = [fp8.get(f"{n}.weight_scale").float() for n in names]
            fused_scale = torch.stack(scales).max()
            altered = 0
            for name, scale in zip(names, scales, strict=True):
                q = fp8.get(f"{name}.weight")
                exact = q.float() * scale  # what the checkpoint says, kept by the split topology
                requant = ops.quantize_fp8((exact / fused_scale).contiguous(), torch.ones(1))
                stats["shards"] += 1
                if torch.equal(requant.view(torch.uint8), q.view(torch.uint8)):
                    continue
                altered += 1
                floor = rms(exact - bf16.get(f"{name}.weight").float())
                stats["ratios"].append(rms(requant.float() * fused_scale - exact) / floor)
                y_exact = x @ exact.t()
                y_fused = x @ (requant.float() * fused_scale).t()
                stats["output"].append(rms(y_fused - y_exact) / rms(y_exact.bfloat16().float() - y_exact))
            stats["groups"] += 1
            stats["shards_altered"] += altered
            stats["groups_altered"] += altered > 0
    return stats


def build_pair(root: Path) -> tuple[Path, Path]:
    from testbed.fp8_checkpoints import make_bf16, make_fp8

    bf16 = make_bf16(root / "bf16", hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                     rope_scaling={"mrope_section": [8, 4, 4]})
    return bf16, make_fp8(bf16, root / "fp8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp8", type=Path, help="static FP8 checkpoint (root or transformer dir)")
    parser.add_argument("--bf16", type=Path, help="the BF16 checkpoint it was exported from")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.fp8 is None:
            args.bf16, args.fp8 = build_pair(Path(tmp))
            print("checkpoint: random 4-layer model (hidden 256), calibrated by max over real forward passes")
        stats = analyse(CheckpointFiles(transformer_dir(args.fp8)), CheckpointFiles(transformer_dir(args.bf16)))
    print("| fused groups altered | shards re-quantized | added weight error / quantization floor "
          "| added output error / BF16 output floor |")
    print("|---|---|---|---|")
    print(f"| {stats['groups_altered']}/{stats['groups']} ({100 * stats['groups_altered'] / stats['groups']:.0f}%) "
          f"| {stats['shards_altered']}/{stats['shards']} ({100 * stats['shards_altered'] / stats['shards']:.0f}%) "
          f"| {spread(stats['ratios'])} | {spread(stats['output'])} |")


def spread(values: list[float]) -> str:
    """min / median / max of per-shard ratios."""
    t = torch.tensor(values or [0.0])
    return f"{t.min():.2f}x / {t.median():.2f}x / {t.max():.2f}x"


if __name__ == "__main__":
    main()
