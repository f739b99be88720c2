"""Mistral: calls after the [TOOL_CALLS] control token, in one of two layouts.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]   v0.3, Nemo
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}                        Small 3.2, Devstral,
                                                                          Magistral (v11+)

The chat template says which ("[ARGS]" in it: the second). [TOOL_CALLS] and [ARGS] are
special tokens in Mistral's tokenizers, so these outputs are detokenized with their special
tokens, and the grammar lets the model write the marker as its token. Call ids are 9 letters
or digits, as the templates require of past calls (other ids in the history are mapped).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .base import (
    JsonCallReader,
    JsonValue,
    Text,
    ToolParser,
    ToolStream,
    called_tools,
    random_id,
    schema_format,
    skip_ws,
    structural_tag,
)

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_ID = re.compile(r"[A-Za-z0-9]{9}")
_NAME_ARGS = re.compile(r"([A-Za-z0-9_-]{1,64})" + re.escape(ARGS))
_NAME_ARGS_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,64}(\[(A(R(G(S\]?)?)?)?)?)?")  # may become one


class MistralParser(ToolParser):
    name = "mistral"
    special_markers = (TOOL_CALLS, ARGS)

    @property
    def args_layout(self) -> bool:
        return ARGS in self.template

    def constraint(self, plan) -> dict:
        return structural_tag(self._args_format(plan) if self.args_layout
                              else self._list_format(plan))

    def _list_format(self, plan) -> dict:
        tags = [{"type": "tag", "begin": f'{{"name": "{t.name}", "arguments": ',
                 "content": schema_format(t.parameters), "end": "}"} for t in called_tools(plan)]
        block = {"type": "tag", "begin": TOOL_CALLS + "[", "content": _calls(plan, tags, ", "),
                 "end": "]"}
        if plan.mode != "auto":
            return block
        return {"type": "triggered_tags", "triggers": [TOOL_CALLS], "tags": [block],
                "stop_after_first": True}

    def _args_format(self, plan) -> dict:
        tags = [{"type": "tag", "begin": f"{TOOL_CALLS}{t.name}{ARGS}",
                 "content": schema_format(t.parameters), "end": ""} for t in called_tools(plan)]
        if plan.mode != "auto":  # calls only
            return _calls(plan, tags, "")
        return {"type": "triggered_tags", "triggers": [TOOL_CALLS], "tags": tags,
                "stop_after_first": not plan.parallel}

    def stream(self, plan) -> ToolStream:
        return MistralStream(self, plan)

    def call_text(self, name: str, arguments: Any) -> str:
        args = json.dumps(arguments, ensure_ascii=False)
        if self.args_layout:
            return f"{TOOL_CALLS}{name}{ARGS}{args}"
        return f'{TOOL_CALLS}[{{"name": {json.dumps(name)}, "arguments": {args}}}]'

    def new_id(self) -> str:
        return random_id(9)

    def history_id(self, call_id: str | None) -> str | None:
        if call_id is None or _ID.fullmatch(call_id):
            return call_id
        return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _calls(plan, tags: list[dict], separator: str) -> dict:
    """One or more of `tags` (one only for a named tool or without parallel calls)."""
    return {"type": "tags_with_separator", "tags": tags, "separator": separator,
            "at_least_one": True, "stop_after_first": not plan.parallel or plan.mode == "named"}


class MistralStream(ToolStream):
    openers = (TOOL_CALLS,)

    def _calls_begin(self, opener: str) -> None:
        self.layout: str | None = None  # "list" or "args", from what follows the marker
        self.reader: JsonCallReader | None = None
        self.value: JsonValue | None = None

    def _call_step(self, final: bool) -> bool:
        if self.layout is None:
            self.buf = skip_ws(self.buf)
            if not self.buf:
                return False
            self.layout = "list" if self.buf.startswith("[") else "args"
            self.buf = self.buf[1:] if self.layout == "list" else self.buf
        return self._list_step(final) if self.layout == "list" else self._args_step(final)

    def _list_step(self, final: bool) -> bool:
        if self.reader is not None and not self.reader.done:
            return self.reader.step(final)
        rest = skip_ws(self.buf)
        if self.reader is not None and rest.startswith(","):  # the next call
            self.buf, self.reader = rest[1:], None
            return True
        if self.reader is None and not rest.startswith("]"):
            self.buf = rest
            if not rest:
                return False
            self.reader = JsonCallReader(self)
            return True
        if not rest and not final:
            return False
        self.buf = rest[1:] if rest.startswith("]") else rest
        self._leave_calls()
        return True

    def _args_step(self, final: bool) -> bool:
        if self.value is None:
            match = _NAME_ARGS.match(self.buf)
            if match is None:
                if final or not _NAME_ARGS_PREFIX.fullmatch(self.buf):
                    self._leave_calls()  # not a call after all: text
                    self.out.append(Text(TOOL_CALLS))
                    return True
                return False
            self._start_call(match.group(1))
            self.buf, self.value = self.buf[match.end():], JsonValue()
        used, ended = self.value.scan(self.buf)
        self._args(self.buf[:used])
        self.buf = self.buf[used:]
        if ended:
            self._leave_calls()
        return ended

    def _call_end_of_output(self) -> None:
        started = self.value is not None or (self.reader is not None and self.reader.started)
        if not started:
            self.out.append(Text(TOOL_CALLS + ("[" if self.layout == "list" else "")
                                 + self.buf))
