"""A YAML document as plain Python values plus the source line of every value.

`yaml.safe_load` forgets where things were; manifest errors must say `file:line`. So the document is
composed into nodes (`yaml.compose` keeps `start_mark`), converted to plain values here, and each
value's line is kept in a table keyed by its path, e.g. `("jobs", 2, "size")`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path_ = tuple  # ("jobs", 2, "size"): mapping keys and sequence indices from the root


@dataclass
class Document:
    value: Any
    lines: dict[Path_, int] = field(default_factory=dict)  # path -> 1-based line
    # (path, line, message) for what composing found: syntax errors, duplicate keys
    problems: list[tuple[Path_, int | None, str]] = field(default_factory=list)

    def line(self, path: Path_) -> int | None:
        """The line of `path`, or of its nearest ancestor that exists (a missing key points at its parent)."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None


def parse(text: str) -> Document:
    """Parses one YAML document; a syntax error becomes a single Problem at its line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Document(None)
        doc = Document(None)
        doc.value = _convert(node, (), loader, doc)
        return doc
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        message = f"YAML syntax: {err.problem}"
        if err.context and err.context_mark:
            # An unclosed quote or bracket fails at the end of the file; say where it was opened.
            message += f" ({err.context} from line {err.context_mark.line + 1})"
        return Document(None, problems=[((), mark.line + 1 if mark else None, message)])
    finally:
        loader.dispose()


def _convert(node: yaml.Node, path: Path_, loader: yaml.SafeLoader, doc: Document) -> Any:
    doc.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        return _convert_mapping(node, path, loader, doc)
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), loader, doc) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def _convert_mapping(node: yaml.MappingNode, path: Path_, loader: yaml.SafeLoader, doc: Document) -> dict:
    out: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)):
            doc.problems.append((path, line, f"keys must be plain scalars, got {key!r}"))
            continue
        if key in out:
            doc.problems.append(((*path, key), line, f"duplicate key (first at line {doc.lines[(*path, key)]})"))
            continue
        # A key's errors point at the key's line, which for a nested block is above its value.
        doc.lines[(*path, key)] = line
        out[key] = _convert(value_node, (*path, key), loader, doc)
    return out


def format_path(path: Path_, job_ids: dict[int, str] | None = None) -> str:
    """`("jobs", 2, "size")` -> `jobs[2] (id=extend) -> size` (the id shown when known)."""
    parts: list[str] = []
    for item in path:
        if isinstance(item, int) and parts:
            parts[-1] += f"[{item}]"
        else:
            parts.append(str(item))
    if job_ids and len(path) > 1 and path[0] == "jobs" and path[1] in job_ids:
        parts[0] += f" (id={job_ids[path[1]]})"
    return " -> ".join(parts)
