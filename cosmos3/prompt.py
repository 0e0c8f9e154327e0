"""Prompt -> token ids, exactly as the published Cosmos3 pipeline builds them (reference §4.1).

Cosmos3 has no text encoder: the transformer embeds raw token ids with its own ``embed_tokens``.
Each branch of classifier-free guidance gets one chat-templated conversation (system prompt + user
prompt with metadata sentences), followed by ``eos`` and ``<|vision_start|>``, after which the
generation tokens begin. The negative prompt carries the *inverse* metadata sentences.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from cosmos3.background_build import BackgroundBuild
from cosmos3.checkpoint_files import read_bounded
from cosmos3.errors import CheckpointError
from cosmos3.library_import import LIBRARY_IMPORT

# The typo "give" (for "given") is intentional: it is what the model was trained on.
SYSTEM_PROMPT_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."
SYSTEM_PROMPT_IMAGE = "You are a helpful assistant who will generate images from a give prompt."

DURATION_TEMPLATE = "The video is {duration:.1f} seconds long and is of {fps:.0f} FPS."
INVERSE_DURATION_TEMPLATE = "The video is not {duration:.1f} seconds long and is not of {fps:.0f} FPS."
RESOLUTION_TEMPLATE = {
    "video": "This video is of {height}x{width} resolution.",
    "image": "This image is of {height}x{width} resolution.",
}
INVERSE_RESOLUTION_TEMPLATE = {
    "video": "This video is not of {height}x{width} resolution.",
    "image": "This image is not of {height}x{width} resolution.",
}

VISION_START_TOKEN = "<|vision_start|>"
# The published pipelines' max_sequence_length: a text tokenizer whose model_max_length is larger is held to it.
MAX_TEXT_TOKENS = 4096


@dataclass(frozen=True)
class PromptSpec:
    """What the metadata sentences describe: the output, not the conditioning input."""

    frames: int
    fps: float
    height: int
    width: int

    @property
    def kind(self) -> str:
        return "image" if self.frames == 1 else "video"


def _append_sentence(text: str, sentence: str) -> str:
    # Trailing full stops are folded into one ". " so "A cat." and "A cat" read the same.
    text = text.rstrip(".")
    return f"{text}. {sentence}" if text else sentence


def _tokenizer_dir(path: str | Path) -> Path:
    path = Path(path)
    if not (path / "tokenizer_config.json").exists():  # whatever is there is read as a bounded regular file
        raise CheckpointError(f"{path}: no tokenizer_config.json (is this the checkpoint's text_tokenizer/ dir?)")
    return path


def with_metadata(text: str, spec: PromptSpec, *, negative: bool) -> str:
    """Append the duration (videos only) and resolution sentences; their inverses when ``negative``."""
    if spec.kind == "video":
        template = INVERSE_DURATION_TEMPLATE if negative else DURATION_TEMPLATE
        text = _append_sentence(text, template.format(duration=spec.frames / spec.fps, fps=spec.fps))
    template = (INVERSE_RESOLUTION_TEMPLATE if negative else RESOLUTION_TEMPLATE)[spec.kind]
    return _append_sentence(text, template.format(height=spec.height, width=spec.width))


def _not_loaded(path: Path, err: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: the text tokenizer did not load ({type(err).__name__}: {err}); "
                           "it needs transformers' tokenizer files (tokenizer.json)")


class TextBudget:
    """How many tokens one branch's text may take, counted by the checkpoint's ``tokenizer.json`` with the
    ``tokenizers`` library (what transformers' fast tokenizer runs, without torch): the prompt with its metadata
    sentences plus the system prompt; the chat template's few markers are not counted. ``farm validate`` and the
    worker's pipeline both count with it (``cosmos3.request``)."""

    def __init__(self, tokenizer, limit: int):
        self._tokenizer, self.limit = tokenizer, limit
        # (prompt, spec, negative) -> tokens: a sweep's seeds share them, so they are counted once
        self._counts: dict[tuple[str, PromptSpec, bool], int] = {}

    @classmethod
    def from_dir(cls, path: str | Path) -> TextBudget:
        """``text_tokenizer/``: its ``tokenizer.json`` and the ``model_max_length`` of its ``tokenizer_config.json``.

        # Raises: CheckpointError naming the file when one is missing or unreadable.
        """
        from tokenizers import Tokenizer

        path = _tokenizer_dir(path)
        try:
            # bounded regular files: a FIFO or a link to /dev/zero is refused, never read
            config = json.loads(read_bounded(path / "tokenizer_config.json"))
            tokenizer = Tokenizer.from_str(read_bounded(path / "tokenizer.json").decode())
        except Exception as err:  # tokenizers raises its own Exception for a file it cannot parse
            raise _not_loaded(path, err) from None
        stated = config.get("model_max_length") if isinstance(config, dict) else None
        valid = isinstance(stated, int) and not isinstance(stated, bool) and stated > 0
        return cls(tokenizer, min(stated, MAX_TEXT_TOKENS) if valid else MAX_TEXT_TOKENS)

    def count(self, prompt: str, spec: PromptSpec, *, negative: bool) -> int:
        """Tokens of the system prompt and ``prompt`` with its metadata sentences (``with_metadata``)."""
        key = (prompt, spec, negative)
        if key not in self._counts:
            system = SYSTEM_PROMPT_IMAGE if spec.kind == "image" else SYSTEM_PROMPT_VIDEO
            text = with_metadata(prompt, spec, negative=negative)
            encoded = self._tokenizer.encode_batch([system, text], add_special_tokens=False)
            self._counts[key] = sum(len(e.ids) for e in encoded)
        return self._counts[key]

    def problem(self, prompt: str, spec: PromptSpec, *, negative: bool) -> str | None:
        """Why ``prompt`` does not fit, or None."""
        count = self.count(prompt, spec, negative=negative)
        if count <= self.limit:
            return None
        return (f"{count:,} tokens with the system prompt and metadata sentences, above the text tokenizer's limit "
                f"of {self.limit:,}; shorten it")


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
        path = _tokenizer_dir(path)
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
        path = _tokenizer_dir(path)
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
            raise _not_loaded(path, err) from err
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
