"""A YAML document as plain Python values plus the source line of every value, read within limits.

`yaml.safe_load` forgets where things were; manifest errors must say `file:line`. So the document is
composed into nodes (`start_mark` keeps the line), converted to plain values here, and each value's line
is kept in a table keyed by its path, e.g. `("jobs", 2, "size")`.

A manifest may come from anyone, so reading it is bounded (`Limits`): its size, its nesting, its aliases
and the values it holds once aliases are expanded (631 bytes of nested aliases expand to billions of
values). Anything else wrong with the bytes (not UTF-8, control characters, a timestamp that is no date)
becomes a located problem, never an exception.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from farm import terminal

try:  # libyaml's parser, ~6x faster; the composer stays PyYAML's so that `_Loader` can count what it builds
    from yaml._yaml import CParser

    class _Base(Composer, CParser, SafeConstructor, Resolver):
        def __init__(self, text: str):
            CParser.__init__(self, text)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
except ImportError:  # a PyYAML built without libyaml
    _Base = yaml.SafeLoader  # type: ignore[misc,assignment]

Path_ = tuple  # ("jobs", 2, "size"): mapping keys and sequence indices from the root

_MERGE = "tag:yaml.org,2002:merge"
_PLAIN_TAGS = {yaml.MappingNode: Resolver.DEFAULT_MAPPING_TAG, yaml.SequenceNode: Resolver.DEFAULT_SEQUENCE_TAG}


class _Refused(Exception):
    """A limit or rule that stops reading; its line is where it was found."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Limits:
    """How much a manifest may hold. Each limit is raised by the environment variable named in its message."""

    bytes: int = 16 << 20  # FARM_YAML_MAX_BYTES: the file's size (a 100,000-seed sweep is ~0.7 MB)
    depth: int = 64  # FARM_YAML_MAX_DEPTH: mappings and lists inside each other (a manifest needs 4)
    aliases: int = 1000  # FARM_YAML_MAX_ALIASES: `*name` references
    # FARM_YAML_MAX_VALUES: keys, scalars, lists and mappings once aliases are expanded (~650 B each while read)
    values: int = 500_000

    @classmethod
    def from_environment(cls) -> Limits:
        """# Raises: _Refused naming a variable that is set but not a positive integer."""
        values = {}
        for item in fields(cls):
            name = _variable(item.name)
            raw = os.environ.get(name)
            if raw is not None:
                if not raw.strip().isdigit() or int(raw) < 1:
                    raise _Refused(None, f"{name}={raw!r} is not a positive integer")
                values[item.name] = int(raw)
        return cls(**values)


def _variable(limit: str) -> str:
    return f"FARM_YAML_MAX_{limit.upper()}"


def _over(limit: str, message: str, line: int | None = None) -> _Refused:
    return _Refused(line, f"{message} (set {_variable(limit)} to raise it)")


@dataclass
class Document:
    value: Any
    lines: dict[Path_, int] = field(default_factory=dict)  # path -> 1-based line
    # (path, line, message) for what reading found: limits, encoding, syntax errors, duplicate keys
    problems: list[tuple[Path_, int | None, str]] = field(default_factory=list)

    def line(self, path: Path_) -> int | None:
        """The line of `path`, or of its nearest ancestor that exists (a missing key points at its parent)."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None


def read(path: Path) -> bytes:
    """The file's bytes, at most one past the size limit (`parse` then refuses it): a huge or endless file
    is never read whole.

    # Raises: OSError.
    """
    try:
        limit = Limits.from_environment().bytes
    except _Refused:  # `parse` reports the variable
        limit = Limits.bytes
    with open(path, "rb") as handle:
        return handle.read(limit + 1)


def parse(data: bytes | str, limits: Limits | None = None) -> Document:
    """Parses one YAML document; every problem (limits, encoding, syntax) becomes a Problem at its line."""
    text = data if isinstance(data, str) else ""
    try:
        limits = limits or Limits.from_environment()
        text = _text(data, limits) if isinstance(data, bytes) else data
        return _read_document(text, limits)
    except _Refused as err:
        line, message = err.line, str(err)
    except yaml.MarkedYAMLError as err:
        line, message = _line(err.problem_mark or err.context_mark), _syntax(err)
    except yaml.reader.ReaderError as err:  # a control character
        line = text.count("\n", 0, err.position) + 1
        message = (f"character {err.character!r} at line {line} is not allowed in YAML ({err.reason}); "
                   "is this a text file?")
    return Document(None, problems=[((), line, message)])


def _read_document(text: str, limits: Limits) -> Document:
    loader = _Loader(text, limits)
    try:
        node = loader.get_single_node()
        doc = Document(None)
        if node is not None:
            _check_expanded(node, limits)
            doc.value = _convert(node, (), loader, doc)
        return doc
    finally:
        loader.dispose()


def _text(data: bytes, limits: Limits) -> str:
    if len(data) > limits.bytes:
        raise _over("bytes", f"the file is larger than the limit of {limits.bytes:,} bytes")
    if data.startswith((b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")):
        raise _Refused(None, "the file is UTF-16 or UTF-32 text; save it as UTF-8")
    if (nul := data.find(b"\x00")) >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise _Refused(line, f"NUL byte at line {line}: the file is binary, or UTF-16/32 text without a "
                             "byte-order mark; a manifest is UTF-8 text")
    try:
        return data.decode("utf-8-sig")  # a UTF-8 byte-order mark is harmless
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise _Refused(line, f"byte 0x{data[err.start]:02x} at line {line} is not UTF-8 text; "
                             "save the file as UTF-8") from None


def _line(mark: Any) -> int | None:
    return mark.line + 1 if mark is not None else None


def _syntax(err: yaml.MarkedYAMLError) -> str:
    column = f" at column {err.problem_mark.column + 1}" if err.problem_mark else ""
    message = f"YAML syntax{column}: {err.problem}"
    if err.context and err.context_mark:
        # An unclosed quote or bracket fails at the end of the file; say where it was opened.
        message += f" ({err.context} from line {err.context_mark.line + 1})"
    return message


class _Loader(_Base):
    """A safe loader whose composer counts nesting, aliases and nodes as it builds, and stops at a limit.

    Numbers in exponent form read as YAML 1.2 reads them: YAML 1.1 needs a dot and a signed exponent, so `1.5e3`
    and `1e-4` would be strings where every user means a number (`1.0e+3` already is one).
    """

    def __init__(self, text: str, limits: Limits):
        super().__init__(text)
        self.limits = limits
        self.depth = self.aliases = self.nodes = 0

    def compose_node(self, parent: Any, index: Any) -> yaml.Node:
        event = self.peek_event()
        line = _line(event.start_mark)
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > self.limits.aliases:
                raise _over("aliases", f"more aliases (*name) than the limit of {self.limits.aliases:,}", line)
            return super().compose_node(parent, index)
        self.nodes += 1
        if self.nodes > self.limits.values:
            raise _over("values", f"more values than the limit of {self.limits.values:,}", line)
        self.depth += 1
        if self.depth > self.limits.depth:
            raise _over("depth", f"nested deeper than the limit of {self.limits.depth} levels", line)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else []


def _check_expanded(root: yaml.Node, limits: Limits) -> None:
    """Sizes the document as `_convert` will build it, aliases expanded, without building it: an alias
    repeats its node's whole subtree, and a node that contains its own alias never ends (depth stops it)."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height) of its expanded subtree

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        known = sizes.get(id(node))
        if known is None and depth <= limits.depth:
            below = [walk(child, depth + 1) for child in _children(node)]
            known = sizes[id(node)] = (1 + sum(v for v, _ in below), 1 + max((h for _, h in below), default=0))
        if known is None or depth + known[1] - 1 > limits.depth:
            raise _over("depth", f"nested deeper than the limit of {limits.depth} levels once aliases are expanded "
                                 "(or an alias sits inside the value it names)", _line(node.start_mark))
        return known

    values, _ = walk(root, 1)
    if values > limits.values:
        raise _over("values", f"{values:,} values once aliases are expanded, more than the limit of {limits.values:,}",
                    _line(root.start_mark))


def _convert(node: yaml.Node, path: Path_, loader: _Loader, doc: Document) -> Any:
    line = node.start_mark.line + 1
    doc.lines.setdefault(path, line)
    if type(node) in _PLAIN_TAGS and node.tag != _PLAIN_TAGS[type(node)]:
        doc.problems.append((path, line, f"tag {node.tag} is not supported here (write a plain mapping or list)"))
        return None
    if isinstance(node, yaml.MappingNode):
        return _convert_mapping(node, path, loader, doc)
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), loader, doc) for i, item in enumerate(node.value)]
    return _scalar(node, path, loader, doc)


def _scalar(node: yaml.Node, path: Path_, loader: _Loader, doc: Document) -> Any:
    try:
        return loader.construct_object(node, deep=True)
    except yaml.MarkedYAMLError as err:  # an unknown tag (!!python/...), bad !!binary
        doc.problems.append((path, node.start_mark.line + 1, err.problem))
    except (ValueError, OverflowError) as err:  # 2001-13-45 looks like a timestamp but is no date
        doc.problems.append((path, node.start_mark.line + 1, f"cannot read {node.value!r} ({node.tag}): {err}"))
    return None


def _convert_mapping(node: yaml.MappingNode, path: Path_, loader: _Loader, doc: Document) -> dict:
    out: dict = {}
    merges: list[yaml.Node] = []
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if key_node.tag == _MERGE:
            merges.append(value_node)
            continue
        key = _scalar(key_node, path, loader, doc) if isinstance(key_node, yaml.ScalarNode) else key_node
        if not isinstance(key, (str, int, float, bool)):
            doc.problems.append((path, line, "keys must be plain scalars (a name or a number)"))
            continue
        # Every key a manifest knows is a name: a key `5` or `yes` is kept as written, so a path never confuses it
        # with a list index (`jobs[0] -> 5`, not `jobs[0][5]`).
        key = key if isinstance(key, str) else key_node.value
        if key in out:
            doc.problems.append(((*path, key), line, f"duplicate key (first at line {doc.lines[(*path, key)]})"))
            continue
        # A key's errors point at the key's line, which for a nested block is above its value.
        doc.lines[(*path, key)] = line
        out[key] = _convert(value_node, (*path, key), loader, doc)
    for value_node in merges:
        _merge(value_node, out, path, loader, doc)
    return out


def _merge(value_node: yaml.Node, out: dict, path: Path_, loader: _Loader, doc: Document) -> None:
    """YAML's merge key (`<<: *base` or `<<: [*a, *b]`): the mapping's own keys win, then earlier mappings.
    Merged values keep the lines where they are written (the anchor's mapping)."""
    sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
    for source in sources:
        if not isinstance(source, yaml.MappingNode):
            doc.problems.append((path, source.start_mark.line + 1,
                                 "<< merges a mapping or a list of mappings into this one (e.g. <<: *base)"))
            continue
        merged = Document(None)
        added = set()
        for key, value in _convert_mapping(source, path, loader, merged).items():
            if key not in out:
                out[key] = value
                added.add(key)
        doc.lines.update({p: n for p, n in merged.lines.items() if len(p) > len(path) and p[len(path)] in added})
        doc.problems.extend(merged.problems)


def format_path(path: Path_, job_ids: dict[int, str] | None = None) -> str:
    """`("jobs", 2, "size")` -> `jobs[2] (id=extend) -> size` (the id shown when known)."""
    parts: list[str] = []
    for item in path:
        if isinstance(item, int) and parts:
            parts[-1] += f"[{item}]"
        else:
            parts.append(terminal.escape(str(item)))  # a key is the manifest's: any string YAML can hold
    if job_ids and len(path) > 1 and path[0] == "jobs" and path[1] in job_ids:
        parts[0] += f" (id={terminal.escape(job_ids[path[1]])})"
    return " -> ".join(parts)
