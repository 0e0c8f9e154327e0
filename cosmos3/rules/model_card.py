"""What a checkpoint says it renders: the ``pipeline_tag`` of its model card (``README.md``), torch-free.

A Hugging Face model repository declares its task in the YAML front matter of its ``README.md`` (the model card):
``pipeline_tag: text-to-image`` (https://huggingface.co/docs/hub/model-cards#specifying-a-task--pipelinetag-),
and ``hf download`` brings that file with the weights. The Super-Text2Image builds share the transformer, VAE and
scheduler layout of the video builds (docs/models.md), so their card is the one file that tells an image-only build
from the others. A card tagged ``text-to-image`` renders stills only; any other tag, no tag or no card at all keeps
every task (the video builds and the checkpoints this project writes itself).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from cosmos3.errors import CheckpointError
from cosmos3.rules.checkpoint_files import open_file

MODEL_CARD = "README.md"
IMAGE_ONLY_TAG = "text-to-image"
IMAGE_TASKS = ("t2i",)
_CARD_LIMIT = 1 << 20  # a model card is a few kB; the front matter sits at its top


def pipeline_tag(root: str | Path) -> str | None:
    """The ``pipeline_tag`` of ``<root>/README.md``'s front matter; None without a card, front matter or tag."""
    path = Path(root) / MODEL_CARD
    try:
        with open_file(path) as card:  # a checkpoint's file: a FIFO or a device there is refused by name, never read
            text = card.read(_CARD_LIMIT).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if end is None:
        return None
    try:
        front = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as err:
        raise CheckpointError(f"{path}: its front matter is not YAML ({err}); fix the card's header") from None
    tag = front.get("pipeline_tag") if isinstance(front, dict) else None
    return tag if isinstance(tag, str) else None


def tasks_of(root: str | Path, all_tasks: tuple[str, ...]) -> tuple[str, ...]:
    """The tasks the checkpoint at ``root`` renders: ``IMAGE_TASKS`` for a ``text-to-image`` card, else
    ``all_tasks``."""
    return IMAGE_TASKS if pipeline_tag(root) == IMAGE_ONLY_TAG else all_tasks
