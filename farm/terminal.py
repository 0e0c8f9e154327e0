"""The terminal is the user's: what the farm prints (messages, tables, its workers' forwarded lines) shows every
character that could act on a terminal as its escape instead of sending it. Log lines already do: structlog's
console renderer shows such a value as its Python repr, which escapes the same characters (`isprintable`).

A manifest can hold any Unicode in a quoted YAML string (`"\\e]0;title\\a"`), and a file or folder name any byte but
`/` and NUL, so ids, keys, paths, the root and the manifest's name can all carry them. Acting characters are the
ones Python's `str.isprintable` refuses: C0 controls (ESC opens every CSI and OSC sequence, BEL ends an OSC), DEL,
C1 controls (U+009B is a CSI on its own), format characters such as the bidi overrides U+202A-U+202E and
U+2066-U+2069 (which reorder what a line shows), line and paragraph separators, spaces other than ' ', and lone
surrogates. Letters, accents and every script stay as written.
"""

from __future__ import annotations

NOT_A_NAME = "which no file name should hold (a control or formatting character, such as ESC or a bidi override)"


def escape(text: str, *, lines: bool = False) -> str:
    """`text` with every acting character written as its Python escape (`\\x1b`, `\\x9b`, `\\u202e`, `\\n`); with
    `lines`, newlines are kept (a message's own line breaks, not a value's)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or (lines and c == "\n") else _escaped(c) for c in text)


def acting(text: str) -> str | None:
    """The first acting character of `text`, escaped; None when it has none. What the farm names itself (its output
    folders and files) holds none: a name a terminal would act on, or show reordered, is no name for a file."""
    found = next((c for c in text if not c.isprintable()), None)
    return None if found is None else _escaped(found)


def _escaped(character: str) -> str:
    return repr(character)[1:-1]  # repr escapes exactly what `isprintable` refuses
