"""OpenAI `tools` / `tool_choice` by constrained decoding.

    tool_choice          the output is held to                              the reply
    "none"               nothing (the tools are not shown)                  content
    "auto" (default)     free text; after "<tool_call>" a call whose        content and/or
                         arguments follow the function's JSON Schema        tool_calls
    "required"           {"name": <a tool>, "arguments": <its schema>}      tool_calls
    {"type": "function", "function": {"name": f}}   f's parameters schema   tool_calls

Calls are written in the Hermes / Qwen format, which the model is told about in a system
message when its chat template does not take `tools` itself:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A streamed request with tools gets its message in one chunk when it finishes.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest

CALL_BEGIN, CALL_END = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(CALL_BEGIN) + r"\s*(\{.*?\})\s*" + re.escape(CALL_END), re.DOTALL)
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses its tools: `mode` is "auto", "required" or "named"."""

    tools: list[Tool]
    mode: str
    named: Tool | None = None

    def sampling_fields(self) -> dict:
        """The constraint, as sampling parameters."""
        if self.mode == "named":
            return {"json_schema": json.dumps(self.named.parameters)}
        if self.mode == "required":
            options = [_call_schema(t) for t in self.tools]
            return {"json_schema": json.dumps(options[0] if len(options) == 1
                                              else {"anyOf": options})}
        tags = [{"type": "tag", "begin": f'{CALL_BEGIN}\n{{"name": {json.dumps(t.name)}, '
                                         '"arguments": ',
                 "content": {"type": "json_schema", "json_schema": t.parameters},
                 "end": f"}}\n{CALL_END}"} for t in self.tools]
        return {"structural_tag": json.dumps({"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": [CALL_BEGIN], "tags": tags}})}

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The assistant message for an output, and the finish_reason to report."""
        content: str | None = text
        calls: list[dict] = []
        if self.mode == "named":
            calls, content = [_call(self.named.name, text)], None
        elif self.mode == "required":
            call = _parse_call(text)
            if call is not None:
                calls, content = [call], None
        else:
            calls = [c for c in map(_parse_call, _CALL_RE.findall(text)) if c is not None]
            if calls:
                content = _CALL_RE.sub("", text).strip() or None
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
            if finish_reason == "stop":
                finish_reason = "tool_calls"
        return message, finish_reason


def plan_tools(tools: list[dict] | None, tool_choice: str | dict | None) -> ToolPlan | None:
    """Validate `tools` and `tool_choice`; None when no tool may be called. Raises
    InvalidRequest naming the field."""
    if tool_choice is not None and not tools and tool_choice != "none":
        raise InvalidRequest("tool_choice needs tools", param="tool_choice")
    if not tools or tool_choice == "none":
        return None
    parsed = [_tool(t, i) for i, t in enumerate(tools)]
    if len({t.name for t in parsed}) != len(parsed):
        raise InvalidRequest("tool names must be unique", param="tools")
    if tool_choice in (None, "auto", "required"):
        return ToolPlan(parsed, tool_choice or "auto")
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest('tool_choice must be "none", "auto", "required" or {"type": '
                             '"function", "function": {"name": ...}}', param="tool_choice")
    named = next((t for t in parsed if t.name == name), None)
    if named is None:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools",
                             param="tool_choice")
    return ToolPlan(parsed, "named", named)


def with_tools(tokenizer: Any, messages: list[dict], history: list[Any],
               plan: ToolPlan | None) -> tuple[list[dict], dict]:
    """The chat-template input for `messages` (one per request message in `history`): past
    tool calls and tool results rendered, the tools described. Returns (messages, extra
    apply_chat_template arguments)."""
    native = "tools" in (getattr(tokenizer, "chat_template", None) or "")
    out = []
    for msg, source in zip(messages, history, strict=True):
        msg = dict(msg)
        if source.tool_calls:
            if native:
                msg["tool_calls"] = [_template_call(c) for c in source.tool_calls]
            else:
                blocks = [_call_text(c) for c in source.tool_calls]
                msg["content"] = "\n".join(filter(None, [msg["content"], *blocks]))
        if source.tool_call_id is not None and native:
            msg["tool_call_id"] = source.tool_call_id
        out.append(msg)
    if plan is None:
        return out, {}
    if native:
        return out, {"tools": [{"type": "function", "function": {
            "name": t.name, "description": t.description or "", "parameters": t.parameters}}
            for t in plan.tools]}
    prompt = _tools_prompt(plan.tools)
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


def _call_schema(tool: Tool) -> dict:
    return {"type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def _call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _parse_call(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None  # cut by max_tokens: the text stays content
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    return _call(value["name"], json.dumps(value.get("arguments", {}), ensure_ascii=False))


def _arguments(call: dict) -> Any:
    """A past call's arguments as a value (clients send them as a JSON string)."""
    arguments = (call.get("function") or {}).get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _template_call(call: dict) -> dict:
    function = call.get("function") or {}
    return {"type": "function", "id": call.get("id"),
            "function": {"name": function.get("name"), "arguments": _arguments(call)}}


def _call_text(call: dict) -> str:
    name = (call.get("function") or {}).get("name")
    body = json.dumps({"name": name, "arguments": _arguments(call)}, ensure_ascii=False)
    return f"{CALL_BEGIN}\n{body}\n{CALL_END}"


def _tools_prompt(tools: list[Tool]) -> str:
    lines = ["You can call these functions:"]
    for t in tools:
        lines.append(json.dumps({"name": t.name, "description": t.description or "",
                                 "parameters": t.parameters}, ensure_ascii=False))
    lines.append(f'To call a function, write {CALL_BEGIN}\n{{"name": <function name>, '
                 f'"arguments": <arguments as JSON>}}\n{CALL_END}')
    return "\n".join(lines)
