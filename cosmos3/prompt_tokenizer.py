"""The text tokenizer: a prompt's two CFG branches as token ids, in the conversation layout
``cosmos3.rules.prompt`` defines (its system prompts, metadata sentences and ``<|vision_start|>``)."""

from __future__ import annotations

import threading
from pathlib import Path

from cosmos3.background_build import BackgroundBuild
from cosmos3.errors import CheckpointError
from cosmos3.library_import import LIBRARY_IMPORT
from cosmos3.rules.prompt import (
    SYSTEM_PROMPT_IMAGE,
    SYSTEM_PROMPT_VIDEO,
    VISION_START_TOKEN,
    PromptSpec,
    TextBudget,
    tokenizer_dir,
    tokenizer_not_loaded,
    with_metadata,
)


class PromptTokenizer:
    """The checkpoint's ``text_tokenizer/`` plus the Cosmos3 conversation layout."""

    def __init__(self, tokenizer, budget: TextBudget):
        self.tokenizer, self.budget = tokenizer, budget
        self.eos_token_id = tokenizer.eos_token_id
        self.vision_start_id = tokenizer.convert_tokens_to_ids(VISION_START_TOKEN)
        if self.eos_token_id is None or self.vision_start_id in (None, tokenizer.unk_token_id):
            raise CheckpointError(
                f"text_tokenizer/ must define an eos token and {VISION_START_TOKEN}; "
                f"got eos_token_id={self.eos_token_id}, {VISION_START_TOKEN} -> {self.vision_start_id}"
            )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> PromptTokenizer:
        path = tokenizer_dir(path)
        # Not beside a background VAE build's import: the load itself imports transformers' modules lazily.
        with LIBRARY_IMPORT:
            return cls._load(path)

    @classmethod
    def load_in_background(cls, path: str | Path) -> BackgroundBuild[PromptTokenizer]:
        """``from_pretrained`` in a thread, so transformers' import overlaps the caller's next work (the
        transformer's load). Its first import took 14 s in a farm worker on an H200 host: transformers 5.17 brings
        in ``torch.distributed.tensor``, sympy and scikit-learn (benchmarks/results/h200-render.md).
        A missing ``tokenizer_config.json`` raises here; what the load raises, at ``result()``. Returns once the
        thread holds LIBRARY_IMPORT, so an import the caller starts next (the VAE's, which pulls in transformers
        too) waits for this one instead of the reverse."""
        path = tokenizer_dir(path)
        holding = threading.Event()

        def load() -> PromptTokenizer:
            with LIBRARY_IMPORT:
                holding.set()
                return cls._load(path)

        build = BackgroundBuild(load, name="load-tokenizer")
        holding.wait()
        return build

    @classmethod
    def _load(cls, path: Path) -> PromptTokenizer:
        from transformers import AutoTokenizer

        budget = TextBudget.from_dir(path)  # first: a broken tokenizer.json fails in the words farm validate uses
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except Exception as err:  # its own words, and which directory they are about
            raise tokenizer_not_loaded(path, err) from err
        return cls(tokenizer, budget)

    def encode(self, text: str, kind: str) -> list[int]:
        """One branch: chat template (system + user, generation prompt) + eos + ``<|vision_start|>``."""
        system = SYSTEM_PROMPT_IMAGE if kind == "image" else SYSTEM_PROMPT_VIDEO
        conversation = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        encoded = self.tokenizer.apply_chat_template(
            conversation, tokenize=True, add_generation_prompt=True, return_dict=True
        )
        return list(encoded["input_ids"]) + [self.eos_token_id, self.vision_start_id]

    def encode_pair(self, prompt: str, negative_prompt: str, spec: PromptSpec) -> tuple[list[int], list[int]]:
        """``(cond_ids, uncond_ids)`` for one job."""
        cond = self.encode(with_metadata(prompt, spec, negative=False), spec.kind)
        uncond = self.encode(with_metadata(negative_prompt, spec, negative=True), spec.kind)
        return cond, uncond
