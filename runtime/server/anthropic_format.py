"""The Message object of /v1/messages (Anthropic's shapes): content blocks, stop_reason, usage.

usage follows Anthropic's arithmetic: input_tokens + cache_read_input_tokens is the prompt,
cache_read_input_tokens the part the radix cache held (cache_creation_input_tokens is 0: the
cache fills itself, at no extra cost).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ..errors import RadixflowError
from ..response_builder import ResponseBuilder
from .anthropic_blocks import tool_use_id
from .anthropic_build import Built
from .openai_responses import finish_reason, usage

SIGNATURE = ""  # radixflow does not sign thinking; a signature sent back is ignored


def thinking_block(text: str) -> dict:
    return {"type": "thinking", "thinking": text, "signature": SIGNATURE}


def text_block(text: str) -> dict:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str, arguments: Any) -> dict:
    return {"type": "tool_use", "id": tool_use_id(call_id), "name": name, "input": arguments}


def message_usage(built: Built, builders: list[ResponseBuilder]) -> dict:
    u = usage(built.job, builders)
    cached = u["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": u["prompt_tokens"] - cached, "output_tokens": u["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def stop_reason(b: ResponseBuilder, tool_calls: bool,
                stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished generation; an aborted one raises."""
    finish = b.finish_reason or {}
    if finish.get("type") == "abort":
        raise RadixflowError(finish.get("message") or "the generation was aborted")
    if finish.get("type") == "length":
        return "max_tokens", None
    if tool_calls:
        return "tool_use", None
    matched = finish.get("matched")
    if isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return "end_turn", None


def content_blocks(built: Built, b: ResponseBuilder) -> list[dict]:
    """A finished generation's blocks: its thinking, its text, then its tool calls."""
    job, text, blocks = built.job, b.text, []
    if job.reasoning is not None:
        thought, text = job.reasoning.split(b.text, job.reasoning.mode(b.req.input_ids),
                                            final=True)
        if thought:
            blocks.append(thinking_block("" if built.omit_thinking else thought))
    calls: list[dict] = []
    if built.tools is not None:
        message, _ = built.tools.message(text, finish_reason(b))
        text, calls = message["content"] or "", message.get("tool_calls") or []
    if text or not calls:
        blocks.append(text_block(text))
    for call in calls:
        blocks.append(tool_use_block(call["id"], call["function"]["name"],
                                     _arguments(call["function"]["arguments"])))
    return blocks


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:  # a call cut short by max_tokens
        return {}


class MessageFormat:
    """The Message of one request: its id and model, set once."""

    def __init__(self, built: Built, model: str):
        self.built, self.model = built, model
        self.id = f"msg_{uuid.uuid4().hex}"

    def envelope(self, content: list[dict], reason: str | None, sequence: str | None,
                 usage_: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence,
                "usage": usage_}

    def stop(self, b: ResponseBuilder, tool_calls: bool) -> tuple[str, str | None]:
        return stop_reason(b, tool_calls, self.built.body.stop_sequences)

    def result(self, builders: list[ResponseBuilder]) -> dict:
        b = builders[0]
        content = content_blocks(self.built, b)
        reason, sequence = self.stop(b, any(c["type"] == "tool_use" for c in content))
        return self.envelope(content, reason, sequence, message_usage(self.built, builders))
