"""A Messages request's system prompt and messages -> chat messages (what render_chat takes).

A user message holds text and tool_result blocks (each result becomes a `tool` message, the
text around them user messages, in order); an assistant message text, tool_use (its
tool_calls) and thinking blocks (sent back from an earlier turn; chat templates drop past
thinking, so they are not rendered). Image, document and every other block type is a 400
naming the block.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import InvalidRequest
from .anthropic_protocol import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .responses import validation_error

_BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock, "tool_use": ToolUseBlock, "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock, "redacted_thinking": RedactedThinkingBlock}
_ALLOWED = {"user": ("text", "tool_result"),
            "assistant": ("text", "tool_use", "thinking", "redacted_thinking")}
JOIN = "\n"  # between the text blocks of one turn
ERROR_PREFIX = "Error: "  # a tool_result with is_error: true


def tool_use_id(call_id: str) -> str:
    """A call id of the tool parser's as Anthropic's `toolu_...` id."""
    return "toolu_" + call_id.removeprefix("call_")


def history_id(use_id: str) -> str:
    """A tool_use id sent back, as the id the parser made (what the template renders)."""
    return use_id.removeprefix("toolu_")


def validated(model: type[BaseModel], raw: Any, where: str) -> Any:
    """`raw` as a `model`, its errors named from `where` (a dotted path in the body)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": (*where.split("."), *e.get("loc", ()))} for e in exc.errors()]
        raise validation_error(errors) from None


def parse_block(raw: Any, role: str, where: str) -> Any:
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in _BLOCKS:
        what = f"{kind!r} blocks" if isinstance(kind, str) else "blocks without a type"
        raise InvalidRequest(f"{where}: {what} are not supported; radixflow serves text only: "
                             "text, tool_use, tool_result and thinking blocks",
                             param=f"{where}.type")
    if kind not in _ALLOWED[role]:
        raise InvalidRequest(f"{where}: a {role} message may not hold {kind} blocks "
                             f"(it may hold {', '.join(_ALLOWED[role])})", param=f"{where}.type")
    return validated(_BLOCKS[kind], raw, where)


def system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return JOIN.join(block.text for block in system) or None


def _result_text(block: ToolResultBlock) -> str:
    content = block.content
    text = content if isinstance(content, str) else JOIN.join(b.text for b in content or ())
    return ERROR_PREFIX + text if block.is_error else text


def _user(blocks: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            texts.append(block.text)
            continue
        if texts:
            out.append({"role": "user", "content": JOIN.join(texts)})
            texts = []
        out.append({"role": "tool", "content": _result_text(block),
                    "tool_call_id": history_id(block.tool_use_id)})
    if texts or not out:
        out.append({"role": "user", "content": JOIN.join(texts)})
    return out


def _assistant(blocks: list[Any]) -> dict[str, Any]:
    text = JOIN.join(b.text for b in blocks if isinstance(b, TextBlock))
    calls = [{"id": history_id(b.id), "type": "function",
              "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
             for b in blocks if isinstance(b, ToolUseBlock)]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(system: str | list[TextBlock] | None,
                  messages: list[Message]) -> list[dict[str, Any]]:
    """The chat messages of a Messages request, the system prompt first."""
    out: list[dict[str, Any]] = []
    text = system_text(system)
    if text:
        out.append({"role": "system", "content": text})
    for k, message in enumerate(messages):
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        where = f"messages.{k}.content"
        blocks = [parse_block(raw, message.role, f"{where}.{j}")
                  for j, raw in enumerate(message.content)]
        if message.role == "user":
            out.extend(_user(blocks))
        else:
            out.append(_assistant(blocks))
    return out


def prefilled(messages: list[dict[str, Any]]) -> bool:
    """Whether the conversation ends with the start of the assistant's answer (Anthropic's
    prefill: the reply continues that text)."""
    last = messages[-1]
    return last["role"] == "assistant" and not last.get("tool_calls")
