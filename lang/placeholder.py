"""Placeholders: the strings tracing passes for arguments and generated values.

A placeholder is marked text, so it survives concatenation and f-strings: a traced text node
knows which arguments and variables it contains.
"""

from __future__ import annotations

import re

_MARK = "\x1e"
MARKER_RE = re.compile(_MARK + r"(arg|var|text):([^" + _MARK + r"]*)" + _MARK)


class Placeholder(str):
    """A stand-in string for an argument or a generated value during tracing."""

    def __new__(cls, kind: str, name: str) -> Placeholder:
        obj = super().__new__(cls, f"{_MARK}{kind}:{name}{_MARK}")
        obj.kind, obj.name = kind, name
        return obj


def markers(text: str) -> list[tuple[str, str]]:
    """(kind, name) of every placeholder in `text`, in order."""
    return MARKER_RE.findall(text)


def text_before_markers(text: str) -> str:
    """`text` up to its first placeholder."""
    return MARKER_RE.split(text, maxsplit=1)[0]


def show_markers(text: str) -> str:
    """`text` with placeholders written as the program wrote them: {arg} or {s['var']}."""
    def show(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        return "{" + name + "}" if kind == "arg" else "{s[" + repr(name) + "]}"

    return MARKER_RE.sub(show, text)
