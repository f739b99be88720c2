"""OpenAI `tools` / `tool_choice` by constrained decoding, in the format the model writes.

    tool_choice          the output is held to                              the reply
    "none"               nothing (the tools are not shown)                  content
    "auto" (default)     free text; a call, once the text starts one, in    content and/or
                         the format, its arguments following the function's  tool_calls
                         JSON Schema
    "required"           at least one call                                  tool_calls
    {"type": "function", "function": {"name": f}}   a call of f             tool_calls

The format (Hermes/Qwen <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS], pythonic, Qwen3-Coder
XML) is the server's tool parser (tool_parsers/): --tool-call-parser, or the one its chat
template shows. A template that does not take `tools` is told about them, and the format, in a
system message. Streamed, a call arrives as OpenAI `delta.tool_calls` chunks while it is
generated: its id and name first, then fragments of its arguments (JSON).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequest
from .tool_parsers import DEFAULT, ArgsDelta, CallStart, Event, Text, ToolParser, get_parser
from .tool_parsers.hermes import CALL_BEGIN, CALL_END

__all__ = ["CALL_BEGIN", "CALL_END", "Tool", "ToolPlan", "plan_tools", "with_tools"]

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses its tools: `mode` is "auto", "required" or "named";
    `parallel`: more than one call may be made (the format allows it and the request did not
    set parallel_tool_calls false)."""

    tools: list[Tool]
    mode: str
    named: Tool | None = None
    parser: ToolParser = field(default_factory=lambda: get_parser(DEFAULT))
    parallel: bool = True

    def sampling_fields(self) -> dict:
        """The constraint, as sampling parameters."""
        return self.parser.constraint(self)

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The assistant message for an output, and the finish_reason to report."""
        content, calls = _assemble(self.parser.parse(self, text))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
            if finish_reason == "stop":
                finish_reason = "tool_calls"
        return message, finish_reason

    def deltas(self) -> ToolDeltas:
        """The parser of one streamed choice."""
        return ToolDeltas(self.parser, self.parser.stream(self))


class ToolDeltas:
    """A streamed choice's text deltas turned into content and `tool_calls` deltas."""

    def __init__(self, parser: ToolParser, stream: Any):
        self.parser, self.stream = parser, stream

    def delta(self, delta: dict, finish_reason: str | None) -> tuple[dict, str | None]:
        """`delta` (its "content", the new text) parsed; the finish_reason to report."""
        text = self.parser.output_text(delta.pop("content", ""), finish_reason is not None)
        events = self.stream.feed(text)
        if finish_reason is not None:
            events += self.stream.finish()
        content = "".join(e.text for e in events if isinstance(e, Text))
        if content:
            delta["content"] = content
        calls: list[dict] = []
        for event in events:
            if isinstance(event, CallStart):
                calls.append({"index": event.index, "id": event.id, "type": "function",
                              "function": {"name": event.name, "arguments": ""}})
            elif isinstance(event, ArgsDelta):
                if not calls or calls[-1]["index"] != event.index:
                    calls.append({"index": event.index, "function": {"arguments": ""}})
                calls[-1]["function"]["arguments"] += event.text
        if calls:
            delta["tool_calls"] = calls
        if finish_reason == "stop" and self.stream.num_calls:
            finish_reason = "tool_calls"
        return delta, finish_reason


def _assemble(events: list[Event]) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a whole output's events."""
    content = "".join(e.text for e in events if isinstance(e, Text)) or None
    calls: list[dict] = []
    for event in events:
        if isinstance(event, CallStart):
            calls.append({"id": event.id, "type": "function",
                          "function": {"name": event.name, "arguments": ""}})
        elif isinstance(event, ArgsDelta):
            calls[event.index]["function"]["arguments"] += event.text
    return content, calls


def plan_tools(tools: list[dict] | None, tool_choice: str | dict | None,
               parallel_tool_calls: bool | None = None,
               parser: ToolParser | None = None) -> ToolPlan | None:
    """Validate `tools` and `tool_choice` (and each tool's schema against what `parser`'s
    format can enforce); None when no tool may be called. Raises InvalidRequest naming the
    field."""
    if tool_choice is not None and not tools and tool_choice != "none":
        raise InvalidRequest("tool_choice needs tools", param="tool_choice")
    if not tools or tool_choice == "none":
        return None
    parser = parser or get_parser(DEFAULT)
    parsed = [_tool(t, i) for i, t in enumerate(tools)]
    if len({t.name for t in parsed}) != len(parsed):
        raise InvalidRequest("tool names must be unique", param="tools")
    parallel = parser.parallel and parallel_tool_calls is not False
    if tool_choice in (None, "auto", "required"):
        plan = ToolPlan(parsed, tool_choice or "auto", parser=parser, parallel=parallel)
    else:
        plan = ToolPlan(parsed, "named", _named(parsed, tool_choice), parser=parser,
                        parallel=parallel)
    parser.check(plan)
    return plan


def _named(tools: list[Tool], tool_choice: Any) -> Tool:
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest('tool_choice must be "none", "auto", "required" or {"type": '
                             '"function", "function": {"name": ...}}', param="tool_choice")
    named = next((t for t in tools if t.name == name), None)
    if named is None:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools",
                             param="tool_choice")
    return named


def with_tools(tokenizer: Any, messages: list[dict], history: list[Any],
               plan: ToolPlan | None, parser: ToolParser | None = None
               ) -> tuple[list[dict], dict]:
    """The chat-template input for `messages` (one per request message in `history`): past
    tool calls and tool results rendered (in `parser`'s format, by default the plan's),
    the tools described. Returns (messages, extra apply_chat_template arguments)."""
    parser = parser or (plan.parser if plan is not None else get_parser(DEFAULT))
    native = "tools" in (getattr(tokenizer, "chat_template", None) or "")
    out = []
    for msg, source in zip(messages, history, strict=True):
        msg = dict(msg)
        if source.tool_calls:
            if native:
                msg["tool_calls"] = [_template_call(c, parser) for c in source.tool_calls]
            else:
                blocks = [parser.call_text(_name(c), _arguments(c)) for c in source.tool_calls]
                msg["content"] = "\n".join(filter(None, [msg["content"], *blocks]))
        if source.tool_call_id is not None and native:
            msg["tool_call_id"] = parser.history_id(source.tool_call_id)
        out.append(msg)
    if plan is None:
        return out, {}
    if native:
        return out, {"tools": [{"type": "function", "function": {
            "name": t.name, "description": t.description or "", "parameters": t.parameters}}
            for t in plan.tools]}
    prompt = _tools_prompt(plan.tools, parser)
    if out and out[0]["role"] in ("system", "developer"):
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out, {}


def _tool(raw: Any, index: int) -> Tool:
    where = f"tools.{index}"
    if not isinstance(raw, dict) or raw.get("type") != "function":
        raise InvalidRequest(f'{where} must be {{"type": "function", "function": {{...}}}}',
                             param=where)
    function = raw.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest(f"{where}.function must be an object", param=f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidRequest(f"{where}.function.name must be 1-64 letters, digits, '_' or '-'",
                             param=f"{where}.function.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"{where}.function.description must be a string",
                             param=f"{where}.function.description")
    parameters = function.get("parameters", _EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"{where}.function.parameters must be a JSON Schema object",
                             param=f"{where}.function.parameters")
    return Tool(name, description, parameters or _EMPTY_PARAMETERS)


def _arguments(call: dict) -> Any:
    """A past call's arguments as a value (clients send them as a JSON string)."""
    arguments = (call.get("function") or {}).get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _name(call: dict) -> Any:
    return (call.get("function") or {}).get("name")


def _template_call(call: dict, parser: ToolParser) -> dict:
    return {"type": "function", "id": parser.history_id(call.get("id")),
            "function": {"name": _name(call), "arguments": _arguments(call)}}


def _tools_prompt(tools: list[Tool], parser: ToolParser) -> str:
    lines = ["You can call these functions:"]
    for t in tools:
        lines.append(json.dumps({"name": t.name, "description": t.description or "",
                                 "parameters": t.parameters}, ensure_ascii=False))
    example = parser.call_text("<function name>", {"<argument>": "<value>"})
    lines.append(f"To call a function, write\n{example}")
    return "\n".join(lines)
