"""Write a Cosmos3 checkpoint in the published directory layout (docs/checkpoints.md §1, §5.2).

``model_index.json``; ``transformer/`` (diffusers ``Cosmos3OmniTransformer.save_pretrained``: bf16
safetensors shards, ``time_embedder`` in fp32, the index, and a config.json that also carries the
published-only keys); ``vae/`` (``AutoencoderKLWan.save_pretrained``); ``text_tokenizer/`` (word-level
``tokenizer.json`` + ``tokenizer_config.json`` with a ChatML template, so ``AutoTokenizer`` loads it as
it loads Qwen's); ``scheduler/``. Used by ``scripts/train_toy.py`` and ``tests/tiny_checkpoint.py``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path

import torch

# Keys the published transformer/config.json carries that diffusers' constructor does not take
# (docs/checkpoints.md §2); written so loaders meet the real file's shape.
PUBLISHED_ONLY_KEYS = {
    "model_type": "qwen3_vl_text",
    "dtype": "bfloat16",
    "max_position_embeddings": 262144,
    "position_embedding_type": "unified_3d_mrope",
    "qk_norm": False,
    "qk_norm_for_diffusion": True,
    "joint_attn_implementation": "two_way",
    "use_moe": True,
    "video_temporal_causal": False,
    "freeze_und": False,
    "initializer_range": 0.02,
    "use_cache": True,
}

# UniPC on flow sigmas with velocity prediction. The shipped config turns Karras spacing on; the
# published docs (and our pipeline) override it with use_karras_sigmas=False and a task flow_shift.
UNIPC_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler",
    "_diffusers_version": "0.37.1",
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 1.0,
    "use_karras_sigmas": True,
    "sigma_min": 0.01,
    "sigma_max": 200.0,
    "predict_x0": True,
    "solver_order": 2,
    "solver_type": "bh2",
    "lower_order_final": True,
    "final_sigmas_type": "zero",
    "timestep_spacing": "linspace",
}

# The distilled 4-step recipe: stochastic FlowMatch-Euler on a fixed sigma list (t_list as the cosmos-framework
# DMD2 default; docs/models.md, "The distilled builds").
DISTILLED_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.37.1",
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "stochastic_sampling": True,
    "fixed_step_sampler_config": {
        "t_list": [0.999, 0.75, 0.5, 0.25],
        "sample_type": "sde",
        "num_train_timesteps": 1000,
    },
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
# Every word of the system prompts and metadata sentences (cosmos3.rules.prompt), the chat roles and the
# digits: what any prompt is wrapped in. A checkpoint's vocabulary adds its caption words.
PROMPT_WORDS = (
    "you are a helpful assistant who will generate videos images from give prompt "
    "the video is not seconds long and of fps this image resolution x . "
    "system user "
    "0 1 2 3 4 5 6 7 8 9"
).split()
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_transformer(model, path: Path, *, extra_config: dict | None = None, max_shard_size: str = "10GB") -> None:
    """``model`` (a diffusers ``Cosmos3OmniTransformer``) as the published files: bf16, time_embedder fp32.

    ``extra_config`` goes straight into ``config.json`` (e.g. a ``quantization_config``).
    """
    # Cast a copy: the caller's model keeps its dtype (a trainer may go on using it).
    model = copy.deepcopy(model)
    for name, param in model.named_parameters():
        if not name.startswith("time_embedder."):  # diffusers keeps it fp32 (_keep_in_fp32_modules)
            param.data = param.data.to(torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True, max_shard_size=max_shard_size)
    saved = json.loads((path / "config.json").read_text())
    write_json(path / "config.json", {**PUBLISHED_ONLY_KEYS, **saved, **(extra_config or {})})


def write_tokenizer(path: Path, words: Iterable[str], *, vocab_size: int) -> None:
    """A word-level ``tokenizer.json`` over ``words`` (+ the special tokens) and its ``tokenizer_config.json``."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"[UNK]": 0}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    # Words and punctuation, then single digits, so "720x1280" and "7.9" map to known tokens.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if tokenizer.get_vocab_size() > vocab_size:
        raise ValueError(f"{tokenizer.get_vocab_size()} tokens do not fit the transformer's vocab_size={vocab_size}")
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "[UNK]",
            "chat_template": CHAT_TEMPLATE,
            "model_max_length": 4096,
        },
    )


def write_pipeline_files(root: Path, scheduler: dict, *, sound: bool = False) -> None:
    """``scheduler/scheduler_config.json`` and the ``model_index.json`` that names every component
    (``sound``: a ``sound_tokenizer/`` too)."""
    write_json(root / "scheduler" / "scheduler_config.json", scheduler)
    components = {
        "scheduler": ["diffusers", scheduler["_class_name"]],
        "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "Cosmos3OmniTransformer"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    if sound:
        components["sound_tokenizer"] = ["diffusers", "Cosmos3AVAEAudioTokenizer"]
    write_json(root / "model_index.json", {"_class_name": "Cosmos3OmniPipeline", "_diffusers_version": "0.37.1",
                                           **components})
