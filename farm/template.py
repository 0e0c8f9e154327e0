"""Output templates: `{name}/{id}_s{seed}` -> each job's file under output.root (the suffix is the task's).

Fields are plain `{field}` only. A format spec renders per job (`{id:.>{steps}.0}` is `.` for a 1-step job and
`..` for a 2-step one), so no check of one sample job could cover every job; without specs a field's value
is a safe path fragment (ids and names match `fields.ID_PATTERN`, the rest are numbers and task names),
and the template's own text decides where files go. `check` reads that text once; every job's rendered
path is then checked again, symlinks resolved, by `check_target` (at plan time and at publish), which
also catches a path that only some values make reserved (`.far{id}` for id `m`).
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

from farm import terminal
from farm.errors import OutputPathError

FIELDS = ("name", "id", "seed", "task", "width", "height", "steps")
DEFAULT = "{name}/{id}_s{seed}"


class TemplateError(ValueError):
    """The template breaks a rule; the message follows `output -> path: `."""


def check(template: str, reserved: str) -> None:
    """`reserved`: the folder under the root that is the farm's own (its records).

    # Raises: TemplateError naming the first rule the template breaks.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:  # "Single '}' encountered", "expected '}' before end of string"
        raise TemplateError(f"{template!r} is not a template: {err} (write {{{{ and }}}} for literal braces)") from None
    shape = []  # the template with every field replaced by `x`: where its own text puts files
    for literal, name, spec, conversion in parts:
        shape.append(literal)
        if name is None:
            continue
        if name not in FIELDS:
            raise TemplateError(f"unknown field {{{name}}} (use {', '.join('{' + f + '}' for f in FIELDS)})")
        if spec or conversion:
            written = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise TemplateError(f"{written}: format specs and conversions are not supported (they render "
                                f"per job, e.g. '..' for some); write plain fields such as {{{name}}}")
        shape.append("x")
    _check_layout(template, "".join(shape), reserved)


def _check_layout(template: str, shape: str, reserved: str) -> None:
    fix = f"use a relative path such as {DEFAULT}"
    components = shape.split("/")
    if (character := terminal.acting(shape)) is not None:
        raise TemplateError(f"{template!r} holds {character}, {terminal.NOT_A_NAME}")
    if shape.startswith("/") or ".." in components:
        raise TemplateError(f"{template!r} leaves output.root; {fix}")
    if reserved in components:  # at any depth: a folder holding `.farm/` is an output root (`farm.claims`)
        raise TemplateError(f"{template!r} writes into a folder named {reserved}/, the farm's own records (a folder "
                            f"holding one is an output root); {fix}")
    if components[-1] in ("", "."):
        raise TemplateError(f"{template!r} names a folder, not a file; end it with a name such as {{id}}_s{{seed}}")


def render(template: str, values: dict[str, Any]) -> str:
    """The job's path relative to output.root, without the suffix (`check` has passed)."""
    return template.format(**{name: values[name] for name in FIELDS})


def check_target(root: str | Path, media: str | Path, reserved: str) -> Path:
    """Where `media` will really be written, its folder's symlinks resolved: refused unless inside `root` and
    outside every folder named `reserved` below it (the farm's records: a folder holding one is an output root).
    Run for every job at plan time and again at publish.

    # Raises: OutputPathError naming the symlink that leads out, if one does.
    """
    root, media = Path(root), Path(media)
    real_root = root.resolve()
    real = media.parent.resolve() / media.name
    if not real.is_relative_to(real_root):
        link = next((p for p in reversed(media.parents) if p.is_relative_to(root) and p.is_symlink()), None)
        through = f" through the symlink {link} -> {os.readlink(link)}" if link else ""
        raise OutputPathError(f"{media} leads to {real}{through}, outside output.root {real_root}")
    parts = real.relative_to(real_root).parts
    if reserved in parts:
        records = real_root.joinpath(*parts[:parts.index(reserved) + 1])
        raise OutputPathError(f"{media} is inside {records}, the farm's own records (a folder holding one is an "
                              f"output root)")
    return real
