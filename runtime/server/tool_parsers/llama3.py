"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole answer is one JSON object,

    {"name": "get_weather", "parameters": {"city": "Paris"}}

sometimes after <|python_tag|> (a special token, so only seen with skip_special_tokens
off). The templates take one call per assistant message ("This model only supports single
tool-calls at once!"), so there are no parallel calls. The constraint is xgrammar's "llama"
structural tag; in tool_choice auto a call starts wherever the text writes '{"name": '.
"""

from __future__ import annotations

import json
from typing import Any

from .base import JsonCallReader, Text, ToolParser, ToolStream, builtin_tag, skip_ws

PYTHON_TAG = "<|python_tag|>"
_CALL_START = '{"name"'


class Llama3Parser(ToolParser):
    name = "llama3"
    parallel = False

    def constraint(self, plan) -> dict:
        return builtin_tag("llama", plan, "")

    def stream(self, plan) -> ToolStream:
        return Llama3Stream(self, plan)

    def call_text(self, name: str, arguments: Any) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)


class Llama3Stream(ToolStream):
    openers = (PYTHON_TAG, _CALL_START)

    def _calls_begin(self, opener: str) -> None:
        self.tagged = opener == PYTHON_TAG
        if not self.tagged:
            self.buf = opener + self.buf  # the opener is the call's first characters
        self.reader = JsonCallReader(self)

    def _call_step(self, final: bool) -> bool:
        if not self.reader.started:
            self.buf = skip_ws(self.buf)
            if self.tagged and len(self.buf) >= len(_CALL_START) and not self.buf.startswith(
                    _CALL_START):  # <|python_tag|> before something else: text
                self._leave_calls()
                return True
        if not self.reader.done:
            return self.reader.step(final)
        rest = self.buf.lstrip(" \t\r\n;")  # parallel calls, where written, are ';'-separated
        if not rest and not final:
            return False
        self.buf = rest
        self._leave_calls()
        return True

    def _call_end_of_output(self) -> None:
        if not self.reader.started:
            self.out.append(Text(self.held + ("" if not self.tagged else PYTHON_TAG)
                                 + self.buf))
