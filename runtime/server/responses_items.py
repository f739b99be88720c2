"""Responses API items -> chat messages (what render_chat takes).

An item is a message ({"role", "content"}, "type": "message" optional) whose content is a
string or input_text / output_text / refusal parts, a function_call (an assistant tool call),
a function_call_output (a tool result) or a reasoning item (kept in the conversation, not
rendered again: chat templates drop past thinking). Anything else is a 400 naming it.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import InvalidRequest

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal",
               "summary_text": "text", "reasoning_text": "text"}
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                "reasoning": "rs"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's `input` as checked items, each with a type and an id."""
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not raw:
        raise InvalidRequest("input must not be empty", param="input")
    return [_item(item, f"input.{k}") for k, item in enumerate(raw)]


def _item(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = raw.get("type", "message" if "role" in raw else None)
    if kind == "message":
        item = {"type": "message", "role": _role(raw, where),
                "content": _content(raw.get("content"), f"{where}.content")}
    elif kind == "function_call":
        item = {"type": "function_call", "call_id": _str(raw, "call_id", where),
                "name": _str(raw, "name", where), "arguments": _str(raw, "arguments", where)}
    elif kind == "function_call_output":
        output = raw.get("output")
        if not isinstance(output, str):
            output = _content(output, f"{where}.output")
        item = {"type": "function_call_output", "call_id": _str(raw, "call_id", where),
                "output": output}
    elif kind == "reasoning":
        item = {"type": "reasoning", "summary": _parts(raw.get("summary") or [], where)}
    elif kind == "item_reference":
        raise InvalidRequest(f"{where}: item_reference is not supported; send the item itself "
                             "or continue with previous_response_id", param=f"{where}.type")
    else:
        raise InvalidRequest(f"{where}: input items of type {kind!r} are not supported "
                             "(message, function_call, function_call_output and reasoning "
                             "are)", param=f"{where}.type")
    given = raw.get("id")
    item["id"] = given if isinstance(given, str) and given else new_id(_ITEM_PREFIX[kind])
    return item


def _role(raw: dict, where: str) -> str:
    role = raw.get("role")
    if role not in _ROLES:
        raise InvalidRequest(f"{where}.role must be one of {list(_ROLES)}", param=f"{where}.role")
    return role


def _str(raw: dict, key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of content parts",
                             param=where)
    return "".join(_parts(content, where))


def _parts(parts: Any, where: str) -> list[str]:
    if not isinstance(parts, list):
        raise InvalidRequest(f"{where} must be a list of content parts", param=where)
    texts = []
    for k, part in enumerate(parts):
        at = f"{where}.{k}"
        kind = part.get("type") if isinstance(part, dict) else None
        key = _TEXT_PARTS.get(kind)
        if key is None:
            raise InvalidRequest(f"{at}: content parts of type {kind!r} are not supported; "
                                 "radixflow takes text (input_text, output_text, refusal)",
                                 param=f"{at}.type")
        text = part.get(key)
        if not isinstance(text, str):
            raise InvalidRequest(f"{at}.{key} must be a string", param=f"{at}.{key}")
        texts.append(text)
    return texts


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict]:
    """The chat messages of a conversation: the instructions as a system message, then each
    item (consecutive function calls join the assistant message before them)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item["type"]
        if kind == "message":
            messages.append({"role": item["role"], "content": item["content"]})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": item["output"],
                             "tool_call_id": item["call_id"]})
    if not any(m["role"] != "system" for m in messages):
        raise InvalidRequest("input has no message to answer", param="input")
    return messages


def history_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as input items of the next turn."""
    items = []
    for out in output:
        if out["type"] == "message":
            text = "".join(p.get("text", "") for p in out["content"])
            items.append({"type": "message", "role": "assistant", "content": text,
                          "id": out["id"]})
        elif out["type"] == "function_call":
            items.append({k: out[k] for k in ("type", "call_id", "name", "arguments", "id")})
        elif out["type"] == "reasoning":
            items.append({"type": "reasoning", "id": out["id"], "summary": []})
    return items


def listed_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as /v1/responses/{id}/input_items lists it (OpenAI's shapes)."""
    if item["type"] == "message":
        kind = "output_text" if item["role"] == "assistant" else "input_text"
        return {"type": "message", "id": item["id"], "role": item["role"], "status": "completed",
                "content": [{"type": kind, "text": item["content"]}]}
    if item["type"] == "reasoning":
        return {**item, "summary": [{"type": "summary_text", "text": t}
                                    for t in item["summary"]]}
    return {**item, "status": "completed"}
