"""The alphabet of a compiled grammar: one representative byte per class of bytes it cannot
tell apart, which is all a search for a completion needs to try (see completion.py).

    alphabet = byte_alphabet(compiled.grammar)

Read from xgrammar's serialized expressions (Grammar.serialize_json); a format this code does
not know falls back to all printable ASCII, each byte its own class.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# xgrammar's serialized expression types (Grammar.serialize_json, "grammar_expr_data").
_BYTE_STRING, _CHAR_CLASS, _CHAR_CLASS_STAR, _REPEAT, _REGEX = 0, 1, 2, 8, 12
_STRUCTURE = frozenset({3, 4, 5, 6, 7})  # empty, rule reference, sequence, choices, tag dispatch
# A class's representative: '0' and 'a' tokenize well; closers end structures.
_PREFERRED = b'0a"]})>\'123456789 '
# Greedy order: closers, then punctuation literals (',' ':' '.'), digits, letters, the rest.
_GREEDY_FIRST = b'"]})>\''
_SIGNS = b"+-"
_FALLBACK = bytes(range(0x20, 0x7F)) + b"\n\t"


@dataclass(frozen=True)
class Alphabet:
    """One representative per class of bytes the grammar cannot tell apart (every literal byte
    is its own class), plus a UTF-8 character for each class that holds only non-ASCII."""

    reps: tuple[bytes, ...]  # search order
    greedy: tuple[bytes, ...]  # closers first, then literals, digits, letters, the rest
    counted: frozenset[int] = frozenset()  # rules repeated a minimum of 2+ times: {m, n}


def byte_alphabet(grammar: Any) -> Alphabet:
    """The alphabet of an xgrammar Grammar, from its serialized expressions; all printable
    ASCII (each byte its own class) if that format is not the one this code knows."""
    try:
        literals, classes, counted = _grammar_sets(json.loads(grammar.serialize_json()))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return _alphabet([bytes([b]) for b in _FALLBACK], set(_FALLBACK), None)
    groups: dict[tuple, list[int]] = {}
    for b in range(128):
        if b in literals:
            groups[("lit", b)] = [b]
        else:
            groups.setdefault(tuple(_contains(c, b) for c in classes), []).append(b)
    reps = [bytes([_pick(members)]) for members in groups.values()]
    reps += [bytes([b]) for b in sorted(literals) if b >= 128]
    reps += [chr(cp).encode() for cp in _non_ascii_only(classes)]
    return _alphabet(list(dict.fromkeys(reps)), literals, counted)


def _grammar_sets(doc: dict) -> tuple[set[int], list[tuple[bool, list[int]]], set[int]]:
    """(every byte of every literal, [(negated, [lo, hi, lo, hi, ...]) per character class],
    the rules a repeat needs at least twice)."""
    data, indptr = doc["grammar_expr_data"], doc["grammar_expr_indptr"]
    literals: set[int] = set()
    classes: list[tuple[bool, list[int]]] = []
    counted: set[int] = set()
    for i, start in enumerate(indptr):
        end = indptr[i + 1] if i + 1 < len(indptr) else len(data)
        kind, size = data[start], data[start + 1]
        if start + 2 + size != end:
            raise ValueError("unknown serialized grammar layout")
        payload = data[start + 2:end]
        if kind == _BYTE_STRING:
            literals.update(payload)
        elif kind in (_CHAR_CLASS, _CHAR_CLASS_STAR):
            classes.append((bool(payload[0]), payload[1:]))
        elif kind == _REPEAT and payload[1] >= 2:
            counted.add(payload[0])
        elif kind == _REGEX:  # [json_string, pattern bytes...]
            _regex_sets(bytes(payload[1:]).decode("utf-8"), literals, classes)
        elif kind not in _STRUCTURE and kind != _REPEAT:
            raise ValueError(f"unknown grammar expression type {kind}")
    return literals, classes, counted


_CATEGORIES = {"DIGIT": [48, 57], "SPACE": [9, 13, 32, 32],
               "WORD": [48, 57, 65, 90, 95, 95, 97, 122]}


def _regex_sets(pattern: str, literals: set[int], classes: list) -> None:
    """The literals and character classes of a regex (Python's parser reads xgrammar's
    syntax closely enough; a pattern it cannot read raises ValueError: the caller falls back
    to all printable ASCII)."""
    import re._parser as sre  # noqa: PLC0415 (only for grammars that embed a regex)

    try:
        tree = sre.parse(pattern)
    except re.error as exc:
        raise ValueError(str(exc)) from None
    _walk_regex(tree, literals, classes)


def _walk_regex(items, literals: set[int], classes: list) -> None:
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            literals.update(chr(arg).encode())
        elif name == "NOT_LITERAL":
            classes.append((True, [arg, arg]))
        elif name == "ANY":
            classes.append((True, [10, 10]))
        elif name == "IN":
            classes.append(_regex_class(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _walk_regex(arg[2], literals, classes)
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            _walk_regex(arg[-1], literals, classes)
        elif name == "BRANCH":
            for branch in arg[1]:
                _walk_regex(branch, literals, classes)
        elif name not in ("AT", "ASSERT", "ASSERT_NOT"):
            raise ValueError(f"regex construct {name}")


def _regex_class(items) -> tuple[bool, list[int]]:
    negated, ranges = False, []
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            negated = True
        elif name == "LITERAL":
            ranges += [arg, arg]
        elif name == "RANGE":
            ranges += list(arg)
        elif name == "CATEGORY" and str(arg).removeprefix("CATEGORY_") in _CATEGORIES:
            ranges += _CATEGORIES[str(arg).removeprefix("CATEGORY_")]
        else:
            raise ValueError(f"regex class item {name} {arg}")
    return negated, ranges


def _contains(char_class: tuple[bool, list[int]], codepoint: int) -> bool:
    negated, ranges = char_class
    inside = any(ranges[k] <= codepoint <= ranges[k + 1] for k in range(0, len(ranges), 2))
    return inside != negated


def _non_ascii_only(classes: list[tuple[bool, list[int]]]) -> list[int]:
    """A codepoint for each class that matches no ASCII character."""
    out = []
    for negated, ranges in classes:
        if any(_contains((negated, ranges), b) for b in range(128)):
            continue
        if not negated:
            out.append(ranges[0])
        else:
            out.append(next(cp for cp in range(128, 0x110000) if _contains((negated, ranges), cp)
                            and not 0xD800 <= cp <= 0xDFFF))
    return out


def _pick(members: list[int]) -> int:
    for b in _PREFERRED[:2]:
        if b in members:
            return b
    alnum = [b for b in members if chr(b).isalnum()]
    if alnum:
        return alnum[0]
    for b in _PREFERRED:
        if b in members:
            return b
    printable = [b for b in members if 0x20 <= b < 0x7F]
    return (printable or members)[0]


def _alphabet(reps: list[bytes], literals: set[int], counted: set[int] | None) -> Alphabet:
    def rank(rep: bytes) -> tuple[int, int]:
        b = rep[0]
        if b in _GREEDY_FIRST:
            return (0, _GREEDY_FIRST.index(b))
        if b in literals and not chr(b).isalnum() and b < 128 and b not in _SIGNS:
            return (1, b)
        if 0x30 <= b <= 0x39:
            return (2, b)
        return (3 if 0x20 <= b < 0x7F else 4, b)

    # Without the grammar's repeats, no child counts as a loop (see completion._is_loop).
    return Alphabet(reps=tuple(reps), greedy=tuple(sorted(reps, key=rank)),
                    counted=frozenset(counted) if counted is not None else _ALL)


class _Everything(frozenset):
    def __contains__(self, item: object) -> bool:
        return True


_ALL = _Everything()
