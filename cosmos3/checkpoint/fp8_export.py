"""BF16 Cosmos3 checkpoint in, static-FP8 checkpoint out, quantized and written by NVIDIA ModelOpt.

    pip install '.[quantize]'
    python -m cosmos3.checkpoint.fp8_export /ckpt/bf16 /ckpt/fp8 [--recipe cosmos|stock] [--prompts prompts.txt]

1. diffusers' ``Cosmos3OmniTransformer`` from the BF16 checkpoint (bf16, time_embedder fp32).
2. ``mtq.quantize`` with ModelOpt's ``FP8_DEFAULT_CFG`` (per-tensor FP8 weights and static
   inputs, max calibration). The forward loop is ours: full renders of our pipeline (both CFG
   branches, every denoising step) with diffusers' model as the velocity, so each projection
   is calibrated on the activations a render really produces.
3. ``modelopt.torch.export.export_hf_checkpoint`` writes ``transformer/`` (its diffusers path:
   e4m3 weights, 0-d fp32 ``weight_scale``/``input_scale``, ``quantization_config`` with the
   ``ignore`` list); the other components are copied unchanged.
4. The ``diffusion_step_policy`` goes into ``quantization_config.runtime`` (docs/checkpoints.md §6).

Recipes: ``cosmos`` also excludes ``proj_in`` and the ``time_embedder``, as the published FP8
checkpoints do; ``stock`` is ModelOpt's config unchanged, as its diffusers example runs it (proj_in
and time_embedder then load W8A8). ModelOpt's defaults already keep proj_out, the LM head and the
embeddings high precision.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cosmos3.rules.checkpoint_header import inspect
from cosmos3.rules.config import Cosmos3Config
from cosmos3.rules.request import RenderRequest

# Quantizer-name globs each recipe disables on top of ModelOpt's FP8_DEFAULT_CFG.
RECIPE_EXCLUSIONS = {"cosmos": ("*proj_in*", "*time_embedder*"), "stock": ()}

# The policy the published video FP8 builds carry (first 3 / last 3 steps W8A16, reasoner A16).
PUBLISHED_STEP_POLICY = {
    "schema_version": 1, "type": "first_last_n", "index_space": "denoising_loop_iteration",
    "scope": ["transformer"], "default_mode": "native",
    "first_steps": {"count": 3, "mode": "a16"}, "last_steps": {"count": 3, "mode": "a16"},
    "overlap": "a16", "reasoner": "a16",
}

# Calibration prompts of the command line when none are given: varied scenes, motion and light.
DEFAULT_PROMPTS = (
    "A red car drives along a wet city street at night, neon signs reflecting on the asphalt.",
    "A golden retriever runs across a sunny meadow toward the camera.",
    "A robot arm picks up a blue cube from a cluttered workbench in a bright lab.",
    "Waves roll onto a rocky beach at sunset under an orange sky.",
)


def quantize_config(recipe: str = "cosmos", exclude: Sequence[str] = ()) -> dict:
    """ModelOpt's FP8 per-tensor config for ``recipe``; ``exclude``: further module names kept high precision."""
    import modelopt.torch.quantization as mtq

    _check_recipe(recipe)
    config = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    patterns = list(RECIPE_EXCLUSIONS[recipe]) + [f"{name}.*" for name in exclude]
    config["quant_cfg"] += [{"quantizer_name": pattern, "enable": False} for pattern in patterns]
    return config


def _check_recipe(recipe: str) -> None:
    if recipe not in RECIPE_EXCLUSIONS:
        raise ValueError(f"recipe={recipe!r}; expected one of {sorted(RECIPE_EXCLUSIONS)}")


def quantize(model, forward_loop: Callable, *, recipe: str = "cosmos", exclude: Sequence[str] = ()):
    """``mtq.quantize`` diffusers' model in place; ``forward_loop(model)`` runs the calibration passes."""
    import modelopt.torch.quantization as mtq

    return mtq.quantize(model, quantize_config(recipe, exclude), forward_loop=forward_loop)


def export(model, directory: str | Path, *, step_policy: dict | None, max_shard_size: str = "10GB") -> Path:
    """ModelOpt's export of a quantized transformer into ``directory``, plus the step policy."""
    from modelopt.torch.export import export_hf_checkpoint

    directory = Path(directory)
    export_hf_checkpoint(model, export_dir=directory, max_shard_size=max_shard_size)
    if step_policy is not None:
        path = directory / "config.json"
        config = json.loads(path.read_text())
        config["quantization_config"]["runtime"] = {"diffusion_step_policy": step_policy}
        path.write_text(json.dumps(config, indent=4))
    return directory


def export_fp8(
    src: str | Path,
    dst: str | Path,
    calibration: Iterable[RenderRequest],
    *,
    recipe: str = "cosmos",
    step_policy: dict | None = PUBLISHED_STEP_POLICY,
    max_shard_size: str = "10GB",
    device: str = "cpu",
) -> Path:
    """Write the FP8 checkpoint root ``dst`` from the BF16 root ``src``, calibrated on ``calibration`` renders."""
    from cosmos3.diffusers_model import DiffusersVelocity, load_diffusers_transformer
    from cosmos3.pipeline import Cosmos3Pipeline

    src, dst = Path(src), Path(dst)
    _check_recipe(recipe)
    if (dst / "transformer").exists():
        raise FileExistsError(f"{dst / 'transformer'} exists; remove it (or pick another destination) first")
    requests = list(calibration)
    if not requests:
        raise ValueError("calibration needs at least one render request")
    velocity = DiffusersVelocity(load_diffusers_transformer(src / "transformer").to(device),
                                 Cosmos3Config.from_json(src / "transformer" / "config.json"))
    pipe = Cosmos3Pipeline.from_pretrained(src, device=device, model=velocity, cache="off")

    def forward_loop(model) -> None:
        velocity.model = model
        for request in requests:
            pipe(request)

    quantize(velocity.model, forward_loop, recipe=recipe)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("transformer"), dirs_exist_ok=True)
    export(velocity.model, dst / "transformer", step_policy=step_policy, max_shard_size=max_shard_size)
    inspect(dst)  # what the loader and `farm validate` will check, checked now
    return dst


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="BF16 checkpoint root (model_index.json, transformer/, vae/, ...)")
    parser.add_argument("dst", type=Path, help="where the FP8 checkpoint root is written")
    parser.add_argument("--recipe", choices=sorted(RECIPE_EXCLUSIONS), default="cosmos")
    parser.add_argument("--prompts", type=Path, help="calibration prompts, one per line (default: four built-in)")
    parser.add_argument("--task", choices=("t2v", "t2i"), default="t2v")
    parser.add_argument("--steps", type=int, help="denoising steps per calibration render (default: the recipe's)")
    parser.add_argument("--width", type=int, help="calibration render size (default: the task's)")
    parser.add_argument("--height", type=int)
    parser.add_argument("--frames", type=int, help="frames per calibration clip (default: the task's)")
    parser.add_argument("--step-policy", choices=("published", "none"), default="published",
                        help="the diffusion_step_policy written into the config (none: image / distilled builds)")
    parser.add_argument("--max-shard-size", default="10GB")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    prompts = args.prompts.read_text().splitlines() if args.prompts else DEFAULT_PROMPTS
    requests = [RenderRequest(task=args.task, prompt=p, steps=args.steps, width=args.width, height=args.height,
                              frames=args.frames, seed=i) for i, p in enumerate(p for p in prompts if p.strip())]
    policy = PUBLISHED_STEP_POLICY if args.step_policy == "published" else None
    export_fp8(args.src, args.dst, requests, recipe=args.recipe, step_policy=policy,
               max_shard_size=args.max_shard_size, device=args.device)
    print(f"wrote {args.dst} ({args.recipe} recipe, {len(requests)} calibration renders)")


if __name__ == "__main__":
    main()
