"""The SSE events of a streamed /v1/messages request, in Anthropic's documented order.

message_start (the Message with empty content), ping; then per content block
content_block_start, its content_block_delta events (thinking_delta, text_delta, or
input_json_delta for a tool_use block's input) and content_block_stop; message_delta
(stop_reason, stop_sequence, usage); message_stop. A failure once the stream is under way is
an `error` event, and the stream ends there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from ..errors import RadixflowError
from ..response_builder import ResponseBuilder
from .anthropic_errors import error_event
from .anthropic_format import (
    MessageFormat,
    message_usage,
    text_block,
    thinking_block,
    tool_use_block,
)
from .responses_stream import Splitter  # the text -> thinking/text/call deltas
from .scheduler_client import RequestGroup


class Blocks:
    """The stream's events and the content blocks they open and close. Fed by the
    Responses API's splitter: text, reasoning, call and arguments are its deltas."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking
        self.kinds: list[str] = []  # of every block opened
        self.open = False
        self.pending: list[bytes] = []

    def emit(self, kind: str, **fields: Any) -> None:
        data = orjson.dumps({"type": kind, **fields})
        self.pending.append(b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n")

    def take(self) -> list[bytes]:
        out, self.pending = self.pending, []
        return out

    def _start(self, block: dict) -> None:
        self.close()
        self.kinds.append(block["type"])
        self.open = True
        self.emit("content_block_start", index=len(self.kinds) - 1, content_block=block)

    def _delta(self, **delta: Any) -> None:
        self.emit("content_block_delta", index=len(self.kinds) - 1, delta=delta)

    def _opened(self, kind: str) -> bool:
        return self.open and self.kinds[-1] == kind

    def text(self, delta: str) -> None:
        if not self._opened("text"):
            self._start(text_block(""))
        self._delta(type="text_delta", text=delta)

    def reasoning(self, delta: str) -> None:
        if not self._opened("thinking"):
            self._start(thinking_block(""))
        if not self.omit_thinking:
            self._delta(type="thinking_delta", thinking=delta)

    def call(self, call_id: str, name: str) -> None:
        self._start(tool_use_block(call_id, name, {}))

    def arguments(self, delta: str) -> None:
        self._delta(type="input_json_delta", partial_json=delta)

    def close(self) -> None:
        if self.open:
            self.emit("content_block_stop", index=len(self.kinds) - 1)
            self.open = False

    def finish(self) -> None:
        """Close the last block; a message with no text and no tool call gets an empty text
        block, as the non-stream answer does."""
        if "text" not in self.kinds and "tool_use" not in self.kinds:
            self._start(text_block(""))
        self.close()


async def message_stream(fmt: MessageFormat, group: RequestGroup,
                         builders: list[ResponseBuilder]) -> AsyncIterator[bytes]:
    """The whole SSE body (respond has seen the first outputs: message_start waits for them,
    so its usage knows the cached prompt tokens)."""
    built, b = fmt.built, builders[0]
    blocks = Blocks(built.omit_thinking)
    splitter = Splitter(fmt, b)
    try:
        for _, out in await group.next():
            b.add(out)
        start = fmt.envelope([], None, None, message_usage(built, builders))
        blocks.emit("message_start", message=start)
        blocks.emit("ping")
        while True:
            splitter.feed(b, blocks)
            for chunk in blocks.take():
                yield chunk
            if group.done:
                break
            for _, out in await group.next():
                b.add(out)
        blocks.finish()
        reason, sequence = fmt.stop(b, "tool_use" in blocks.kinds)
        blocks.emit("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                    usage=message_usage(built, builders))
        blocks.emit("message_stop")
    except RadixflowError as exc:  # the server failed (ServerUnavailable), or an abort
        blocks.pending.append(error_event(exc.status_code, str(exc)))
    for chunk in blocks.take():
        yield chunk
