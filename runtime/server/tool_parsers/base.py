"""What every tool-call format shares: the parse events, the parser interface and the
streaming machinery (text, then calls, then text); with json_calls.py (JSON read as it
streams), tags.py (structural tags) and schemas.py (a tool's parameters schema, through the
constraint front door), re-exported here.

A format's parser gives
  - `constraint(plan)`: the sampling fields (a structural tag) that hold the output to the
    format, each call's arguments to its tool's JSON Schema;
  - `stream(plan)`: a ToolStream, fed the output as it is generated; it returns Text, CallStart
    (a call's id and name) and ArgsDelta (a fragment of its arguments as JSON) events.
A full-text parse is the same stream fed everything at once, so a streamed reply and the
non-streamed one agree.
"""

from __future__ import annotations

import secrets
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .json_calls import WHITESPACE, JsonCallReader, JsonValue, skip_ws
from .schemas import ANNOTATIONS, check_flat_object, check_parameters, tool_param
from .tags import MAX_WHITESPACE, builtin_tag, called_tools, schema_format, structural_tag

if TYPE_CHECKING:
    from ..openai_tools import ToolPlan

# What a format's parser builds on, in one import (json_calls, schemas and tags hold some).
__all__ = [
    "ANNOTATIONS", "MAX_WHITESPACE", "ArgsDelta", "CallStart", "Event", "JsonCallReader",
    "JsonValue", "Text", "ToolParser", "ToolStream", "builtin_tag", "called_tools",
    "check_flat_object", "check_parameters", "is_special_token", "random_id", "schema_format",
    "skip_ws", "structural_tag", "tool_param",
]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    index: int
    text: str


Event = Text | CallStart | ArgsDelta


class ToolParser(ABC):
    """One tool-call format. `template` is the chat template the server uses (or None)."""

    name: str
    parallel = True  # the format can hold several calls in one message
    special_markers: tuple[str, ...] = ()  # markers some tokenizers keep as special tokens

    def __init__(self, template: str | None = None):
        self.template = template or ""
        self.special_text = False  # outputs keep special tokens (bind)
        self.stop_texts: tuple[str, ...] = ()  # what then ends an output, to drop

    def bind(self, tokenizer: Any, stop_token_ids: list[int]) -> ToolParser:
        """Fit to the server's tokenizer: when a marker of this format is one of its special
        tokens, outputs are detokenized with special tokens (or the marker would vanish) and
        the stop token's text is dropped from their end."""
        self.special_text = any(is_special_token(tokenizer, m) for m in self.special_markers)
        if self.special_text:
            self.stop_texts = tuple(t for t in tokenizer.convert_ids_to_tokens(
                sorted(set(stop_token_ids))) if t)
        return self

    def output_text(self, text: str, final: bool) -> str:
        """An output's text (or its latest piece) as the parser reads it."""
        for stop in self.stop_texts if final else ():
            text = text.removesuffix(stop)
        return text

    @abstractmethod
    def constraint(self, plan: ToolPlan) -> dict:
        """The sampling fields ({"structural_tag": ...}) for `plan`."""

    @abstractmethod
    def stream(self, plan: ToolPlan) -> ToolStream:
        """A fresh incremental parser of one output."""

    @abstractmethod
    def call_text(self, name: str, arguments: Any) -> str:
        """A past call as the model writes it (for templates that do not take tools)."""

    def check(self, plan: ToolPlan) -> None:
        """Refuse (GrammarError, a 400) a tool whose schema the constraint cannot enforce."""
        for index, tool in enumerate(plan.tools):
            check_parameters(tool, index)

    def new_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def history_id(self, call_id: str | None) -> str | None:
        """A past call's id as the template needs it."""
        return call_id

    def parse(self, plan: ToolPlan, text: str) -> list[Event]:
        stream = self.stream(plan)
        return stream.feed(self.output_text(text, True)) + stream.finish()


def is_special_token(tokenizer: Any, text: str) -> bool:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        return False
    added = getattr(tokenizer, "added_tokens_decoder", {}).get(ids[0])
    return ids[0] in set(getattr(tokenizer, "all_special_ids", [])) or bool(
        getattr(added, "special", False))


def random_id(length: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(length))


# ---- streaming ----

class ToolStream(ABC):
    """Text, calls, text...: text is passed on until one of `openers` starts the calls; the
    subclass's `_call_step` reads calls until it hands back to text. Whitespace right before
    calls, and at the end of an output with calls, is dropped."""

    openers: tuple[str, ...] = ()

    def __init__(self, parser: ToolParser, plan: ToolPlan):
        self.parser, self.plan = parser, plan
        self.buf = ""
        self.in_calls = False
        self.num_calls = 0
        self.held = ""  # whitespace not yet known to be content
        self.out: list[Event] = []

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> list[Event]:
        self._run(final=True)
        if self.in_calls:
            self._call_end_of_output()
        elif self.buf:
            self._text(self.buf)
        self.buf = ""
        if self.held and not self.num_calls:
            self.out.append(Text(self.held))
        self.held = ""
        return self._take()

    def _take(self) -> list[Event]:
        out, self.out = self.out, []
        return out

    def _run(self, final: bool) -> None:
        while self._call_step(final) if self.in_calls else self._text_step(final):
            pass

    def _text_step(self, final: bool) -> bool:
        """Pass text on up to the first opener (then enter the calls); False when stuck."""
        hits = [(self.buf.find(o), o) for o in self.openers]
        hits = [(at, o) for at, o in hits if at >= 0]
        if hits:
            at, opener = min(hits)
            self._text(self.buf[:at])
            self.held = ""  # whitespace before a call is not content
            self.buf = self.buf[at + len(opener):]
            self.in_calls = True
            self._calls_begin(opener)
            return True
        keep = 0 if final else _partial_suffix(self.buf, self.openers)
        self._text(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False

    def _text(self, text: str) -> None:
        if not text:
            return
        body = text.rstrip(WHITESPACE)
        if body:
            self.out.append(Text(self.held + body))
            self.held = ""
        self.held += text[len(body):]

    def _start_call(self, name: str) -> int:
        index = self.num_calls
        self.num_calls += 1
        self.out.append(CallStart(index, self.parser.new_id(), name))
        return index

    def _args(self, text: str) -> None:
        if text:
            self.out.append(ArgsDelta(self.num_calls - 1, text))

    def _leave_calls(self) -> None:
        self.in_calls = False

    @abstractmethod
    def _calls_begin(self, opener: str) -> None:
        """Called once the opener is consumed from buf."""

    @abstractmethod
    def _call_end_of_output(self) -> None:
        """The output ended inside the calls (cut by max_tokens): what the calls already
        streamed stays; text not yet a call becomes content."""

    @abstractmethod
    def _call_step(self, final: bool) -> bool:
        """Consume from buf what can be read now; False when more text is needed."""


def _partial_suffix(text: str, openers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that some opener starts with."""
    best = 0
    for opener in openers:
        for n in range(min(len(opener) - 1, len(text)), best, -1):
            if text.endswith(opener[:n]):
                best = n
                break
    return best

