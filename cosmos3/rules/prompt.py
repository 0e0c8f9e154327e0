"""A prompt's conversation, exactly as the published Cosmos3 pipeline lays it out (docs/checkpoints.md §4.1), and
its token budget (``TextBudget``), torch-free; ``cosmos3.prompt_tokenizer`` turns it into token ids.

Cosmos3 has no text encoder: the transformer embeds raw token ids with its own ``embed_tokens``.
Each branch of classifier-free guidance gets one chat-templated conversation (system prompt + user
prompt with metadata sentences), followed by ``eos`` and ``<|vision_start|>``, after which the
generation tokens begin. The negative prompt carries the *inverse* metadata sentences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cosmos3.errors import CheckpointError
from cosmos3.rules.checkpoint_files import read_bounded
from cosmos3.rules.values import is_int

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


def tokenizer_dir(path: str | Path) -> Path:
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


def tokenizer_not_loaded(path: Path, err: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: the text tokenizer did not load ({type(err).__name__}: {err}); "
                           "it needs transformers' tokenizer files (tokenizer.json)")


class TextBudget:
    """How many tokens one branch's text may take, counted by the checkpoint's ``tokenizer.json`` with the
    ``tokenizers`` library (what transformers' fast tokenizer runs, without torch): the prompt with its metadata
    sentences plus the system prompt; the chat template's few markers are not counted. ``farm validate`` and the
    worker's pipeline both count with it (``cosmos3.rules.request``)."""

    def __init__(self, tokenizer, limit: int):
        self._tokenizer, self.limit = tokenizer, limit
        # (prompt, spec, negative) -> tokens: a sweep's seeds share them, so they are counted once
        self._counts: dict[tuple[str, PromptSpec, bool], int] = {}
        # prompt -> its own tokens, for the prompts far over the limit: counted once whatever the jobs' sizes, so
        # the tokenizer's work is bounded by the manifest's bytes (one alias in every job, each at another fps,
        # would otherwise tokenize a 16 MiB prompt once a job)
        self._alone: dict[str, int] = {}

    @classmethod
    def from_dir(cls, path: str | Path) -> TextBudget:
        """``text_tokenizer/``: its ``tokenizer.json`` and the ``model_max_length`` of its ``tokenizer_config.json``.

        # Raises: CheckpointError naming the file when one is missing or unreadable.
        """
        from tokenizers import Tokenizer

        path = tokenizer_dir(path)
        try:
            # bounded regular files: a FIFO or a link to /dev/zero is refused, never read
            config = json.loads(read_bounded(path / "tokenizer_config.json"))
            tokenizer = Tokenizer.from_str(read_bounded(path / "tokenizer.json").decode())
        except Exception as err:  # tokenizers raises its own Exception for a file it cannot parse
            raise tokenizer_not_loaded(path, err) from None
        stated = config.get("model_max_length") if isinstance(config, dict) else None
        valid = is_int(stated) and stated > 0
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
        """Why ``prompt`` does not fit, or None. A prompt whose own tokens are over twice the limit is refused on them
        alone: its metadata sentences and the system prompt only add tokens (an appended sentence changes how the
        prompt's last word splits at most, never half its tokens)."""
        if len(prompt) > 2 * self.limit:  # a token holds one character at least
            if prompt not in self._alone:
                self._alone[prompt] = len(self._tokenizer.encode(prompt, add_special_tokens=False).ids)
            if self._alone[prompt] > 2 * self.limit:
                return (f"{self._alone[prompt]:,} tokens in the prompt alone, over twice the text tokenizer's limit "
                        f"of {self.limit:,}; shorten it")
        count = self.count(prompt, spec, negative=negative)
        if count <= self.limit:
            return None
        return (f"{count:,} tokens with the system prompt and metadata sentences, above the text tokenizer's limit "
                f"of {self.limit:,}; shorten it")
