"""What every tool-call format shares: the parse events, the parser interface, the streaming
machinery (text, then calls, then text) and the checks of a tool's parameters schema.

A format's parser gives
  - `constraint(plan)`: the sampling fields (a structural tag) that hold the output to the
    format, each call's arguments to its tool's JSON Schema;
  - `stream(plan)`: a ToolStream, fed the output as it is generated; it returns Text, CallStart
    (a call's id and name) and ArgsDelta (a fragment of its arguments as JSON) events.
A full-text parse is the same stream fed everything at once, so a streamed reply and the
non-streamed one agree.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import GrammarError

if TYPE_CHECKING:
    from ..openai_tools import Tool, ToolPlan

_WS = " \t\r\n"
# Consecutive whitespace allowed in a call's arguments (a tiny or confused model otherwise
# writes newlines until max_tokens): what compact JSON and the XML layouts need ("\r\n").
MAX_WHITESPACE = 2
# Schema keywords that only annotate (allowed anywhere a format checks keywords).
ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "examples",
                         "default", "deprecated", "readOnly", "writeOnly"})


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
        body = text.rstrip(_WS)
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


def skip_ws(text: str) -> str:
    return text.lstrip(_WS)


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


# ---- structural tags ----

def structural_tag(fmt: Any) -> dict:
    """The sampling fields of a structural tag format (a pydantic model or a dict)."""
    if hasattr(fmt, "model_dump"):
        fmt = fmt.model_dump(mode="json")
    tag = fmt if fmt.get("type") == "structural_tag" else {"type": "structural_tag",
                                                            "format": fmt}
    return {"structural_tag": json.dumps(tag, ensure_ascii=False)}


def builtin_tag(model: str, plan: ToolPlan, separator: str) -> dict:
    """xgrammar's structural tag for `model`'s format (reasoning left to --reasoning-parser,
    which engages a constraint after the thinking). For tool_choice "required" the output is
    the calls alone, `separator` between them (xgrammar's lets text follow the first)."""
    from xgrammar.builtin_structural_tag import get_model_structural_tag

    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
             for t in plan.tools]
    choice: Any = plan.mode
    if plan.mode == "named":
        choice = {"type": "function", "function": {"name": plan.named.name}}
    tag = get_model_structural_tag(model, tools=tools, tool_choice=choice, reasoning="disabled",
                                   parallel_tool_calls=plan.parallel,
                                   max_whitespace_cnt=MAX_WHITESPACE).model_dump(mode="json")
    fmt = tag["format"]
    if plan.mode == "required" and fmt.get("type") == "triggered_tags":
        tag["format"] = {"type": "tags_with_separator", "tags": fmt["tags"],
                         "separator": separator, "at_least_one": True,
                         "stop_after_first": not plan.parallel}
    return structural_tag(tag)


def schema_format(schema: dict, **extra: Any) -> dict:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE,
            **extra}


def called_tools(plan: ToolPlan) -> list[Tool]:
    return [plan.named] if plan.mode == "named" else plan.tools


# ---- schema checks ----

def tool_param(index: int) -> str:
    return f"tools.{index}.function.parameters"


def check_parameters(tool: Tool, index: int) -> dict:
    """The tool's parameters schema checked (and rewritten) as a json_schema constraint is;
    a refusal names the tool, the keyword and its path."""
    from ...constrained.limits import GrammarLimits
    from ...constrained.schema_check import parse_json_schema

    limits = GrammarLimits()
    try:
        return parse_json_schema(json.dumps(tool.parameters), limits.schema, limits.regex)
    except GrammarError as exc:
        raise GrammarError(f"{tool_param(index)} (tool {tool.name!r}): {exc.message}",
                           param=tool_param(index)) from None


def check_flat_object(tool: Tool, index: int, fmt: str, name_ok: re.Pattern) -> dict:
    """For formats that write each argument by name (XML, pythonic): the top level must be
    an object of named properties. Returns the checked, rewritten schema."""
    schema = check_parameters(tool, index)

    def refuse(keyword: str, why: str) -> GrammarError:
        return GrammarError(f"{tool_param(index)} (tool {tool.name!r}): '{keyword}' at "
                            f"#/{keyword} {why} in {fmt} tool calls, which write each "
                            "argument by name", param=tool_param(index))

    if schema.get("type", "object") != "object":
        raise refuse("type", "must be \"object\"")
    allowed = {"type", "properties", "required", "additionalProperties", "$defs",
               "definitions"} | ANNOTATIONS
    for keyword in sorted(set(schema) - allowed):
        raise refuse(keyword, "is not supported at the top level")
    if schema.get("additionalProperties", False) not in (False, None):
        raise refuse("additionalProperties", "must be false (or absent)")
    for name in schema.get("properties") or {}:
        if not name_ok.fullmatch(name):
            raise refuse(f"properties/{name}", "is not a name the format can write")
    return schema
