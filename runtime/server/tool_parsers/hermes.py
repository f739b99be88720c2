"""Hermes / Qwen2.5 / Qwen3: each call a JSON object between <tool_call> tags.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The constraint is xgrammar's "qwen_3" structural tag: the same format, for tool_choice
auto (text, then calls triggered by <tool_call>), required (a call first) and named.
"""

from __future__ import annotations

import json
from typing import Any

from .base import JsonCallReader, Text, ToolParser, ToolStream, builtin_tag, skip_ws

CALL_BEGIN, CALL_END = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    name = "hermes"

    def constraint(self, plan) -> dict:
        return builtin_tag("qwen_3", plan, "\n")

    def stream(self, plan) -> ToolStream:
        return HermesStream(self, plan)

    def call_text(self, name: str, arguments: Any) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{CALL_BEGIN}\n{body}\n{CALL_END}"


class HermesStream(ToolStream):
    openers = (CALL_BEGIN,)

    def _calls_begin(self, opener: str) -> None:
        self.reader = JsonCallReader(self)

    def _call_step(self, final: bool) -> bool:
        if not self.reader.done:
            self.buf = skip_ws(self.buf) if not self.reader.started else self.buf
            return self.reader.step(final)
        rest = skip_ws(self.buf)
        if rest.startswith(CALL_END):
            self.buf = rest[len(CALL_END):]
            self._leave_calls()
            return True
        if len(rest) >= len(CALL_END) or final:  # not the closing tag: back to text
            self._leave_calls()
            return True
        return False

    def _call_end_of_output(self) -> None:
        if not self.reader.started:  # cut before the call's name was complete
            self.out.append(Text(self.held + CALL_BEGIN + self.buf))
