"""Reading JSON as it streams in: where one value ends, and the `{"name": ..., "arguments":
...}` call the JSON formats (hermes, llama3, mistral) write."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import ToolStream

WHITESPACE = " \t\r\n"


def skip_ws(text: str) -> str:
    return text.lstrip(WHITESPACE)


class JsonValue:
    """Where one JSON value ends, in text that arrives in pieces."""

    def __init__(self) -> None:
        self.kind: str | None = None  # "container", "string" or "scalar"
        self.depth = 0
        self.in_string = self.escaped = False

    def scan(self, text: str) -> tuple[int, bool]:
        """(how many chars of `text` belong to the value, whether it ended there)."""
        for i, ch in enumerate(text):
            if self.kind is None:
                self.kind = ("container" if ch in "{[" else "string" if ch == '"'
                             else "scalar")
                self.depth, self.in_string = int(ch in "{["), ch == '"'
            elif self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.kind == "string":
                        return i + 1, True
            elif self.kind == "scalar":
                if ch in ",}] \t\r\n)":
                    return i, True
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1, True
        return len(text), False


# The header is read once the value's first character is there, so that however the text is
# split into pieces the arguments start at the same place.
_JSON_HEADER = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]{1,64})"\s*,\s*"(?:arguments|parameters)"'
                          r'\s*:\s*(?=\S)')


class JsonCallReader:
    """One `{"name": "f", "arguments": {...}}` call (or "parameters"), read incrementally:
    the name once the header is complete, then the arguments' raw JSON text as it comes."""

    def __init__(self, stream: ToolStream):
        self.stream = stream
        self.value: JsonValue | None = None  # set once the header is read
        self.value_ended = self.done = False

    def step(self, final: bool) -> bool:
        s = self.stream
        if self.value is None:
            match = _JSON_HEADER.match(s.buf)
            if match is None:
                return False
            s._start_call(match.group(1))
            s.buf = s.buf[match.end():]
            self.value = JsonValue()
        if not self.value_ended:
            used, self.value_ended = self.value.scan(s.buf)
            s._args(s.buf[:used])
            s.buf = s.buf[used:]
            if not self.value_ended:
                return False
        rest = skip_ws(s.buf)
        if not rest and not final:
            return False
        if rest.startswith("}"):
            rest = rest[1:]
        s.buf, self.done = rest, True
        return True

    @property
    def started(self) -> bool:
        return self.value is not None

