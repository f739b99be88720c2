"""Keeps compiled grammars to well-formed output.

NOTE: xgrammar lets a negated character class such as [^"] or a bare '.' match the
UTF-16 surrogates U+D800..U+DFFF, whose 3-byte encodings are not valid UTF-8, and writes JSON
strings with minLength/maxLength so that raw control characters (a tab) may appear, which
JSON forbids. A sampled token can produce either, so grammars are rewritten here: printed,
edited, and parsed again.
"""

from __future__ import annotations

import re

_SURROGATES = r"\ud800-\udfff"
_ANY_CHAR = r"[\0-\U0010ffff]"
_LOOSE_STRING_CHARS = r'[^\"\\\r\n]'  # xgrammar's class for length-bounded JSON strings
_JSON_STRING_CHARS = r'[^\0-\x1f\"\\]'
_REGEX_ARG = re.compile(r'Regex\((")')
_EBNF_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "0": "\0"}


def fix_printed_grammar(text: str) -> str:
    """Exclude surrogates from every negated class (also inside Regex("...") arguments) and
    narrow length-bounded JSON string characters to those JSON allows unescaped."""
    text = text.replace(_LOOSE_STRING_CHARS, _JSON_STRING_CHARS)
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            literal = text[i:end]
            if text.endswith("Regex(", 0, i):
                literal = _quote(fix_regex(_unquote(literal)))
            out.append(literal)
            i = end
        elif c == "[":
            end = _class_end(text, i)
            out.append(_fix_class(text[i:end]))
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def fix_regex(pattern: str) -> str:
    """The regex with surrogates excluded from negated classes and from '.'."""
    out: list[str] = []
    i = 0
    in_class = False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
            out.append(c)
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^" + _SURROGATES)
                i += 2
                if pattern.startswith("]", i):  # a literal ']' first in the class
                    out.append("\\]")
                    i += 1
                continue
            out.append(c)
            if pattern.startswith("]", i + 1):
                out.append("\\]")
                i += 1
        elif c == ".":
            out.append("[^\\n\\r\\u2028\\u2029" + _SURROGATES + "]")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _fix_class(chars: str) -> str:
    if chars == _ANY_CHAR:
        return "[^" + _SURROGATES + "]"
    if chars.startswith("[^") and _SURROGATES not in chars:
        return "[^" + _SURROGATES + chars[2:]
    return chars


def _string_end(text: str, start: int) -> int:
    i = start + 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _class_end(text: str, start: int) -> int:
    i = start + 1
    while i < len(text) and text[i] != "]":
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        kind = body[i + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(kind)
        if width:
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append(_EBNF_ESCAPES.get(kind, kind))
            i += 2
    return "".join(out)


def _quote(value: str) -> str:
    escaped = []
    for c in value:
        if c in '\\"':
            escaped.append("\\" + c)
        elif ord(c) < 0x20:
            escaped.append(f"\\x{ord(c):02x}")
        else:
            escaped.append(c)
    return '"' + "".join(escaped) + '"'
