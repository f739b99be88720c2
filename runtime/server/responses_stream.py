"""The SSE events of a streamed /v1/responses request, in OpenAI's documented order.

response.created, response.in_progress; then per output item: response.output_item.added,
for text (message) and thinking (reasoning) response.content_part.added, the
response.output_text.delta (response.reasoning_text.delta) events, its .done and
response.content_part.done, for a function call the response.function_call_arguments.delta
events and .done; response.output_item.done; last response.completed (response.incomplete
when max_output_tokens ended it, response.failed when it failed or was cancelled). Every event
has its sequence_number. A reasoning item whose summary was asked for also streams its one
summary part: response.reasoning_summary_part.added, response.reasoning_summary_text.delta
beside each reasoning delta, their .done events before the item's.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from ..errors import ServerUnavailable
from ..reasoning import ReasoningStream
from ..response_builder import ResponseBuilder
from ..token_bytes import token_bytes
from .openai_responses import finish_reason, utf8_decoder
from .responses_build import Built
from .responses_format import (
    ResponseObject,
    call_item,
    message_item,
    reasoning_item,
    text_part,
    token_logprobs,
    wants_summary,
)
from .scheduler_client import RequestGroup

_FINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
                "failed": "response.failed", "cancelled": "response.failed"}


class Events:
    """Numbered SSE events, and the output items they open and close."""

    def __init__(self, summary: bool = False, logprobs: LogprobCursor | None = None) -> None:
        self.seq, self.summary = 0, summary
        self.logprobs = logprobs  # the output text's logprobs, when asked for
        self.output: list[dict] = []  # every item opened, as it is now
        self.open: dict | None = None
        self.pending: list[bytes] = []

    def emit(self, kind: str, **fields: Any) -> None:
        data = orjson.dumps({"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        self.pending.append(b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n")

    def take(self) -> list[bytes]:
        out, self.pending = self.pending, []
        return out

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output) - 1}

    def start(self, item: dict) -> None:
        self.close("completed")
        item["status"] = "in_progress"
        self.output.append(item)
        self.open = item
        self.emit("response.output_item.added", output_index=len(self.output) - 1,
                  item=copy.deepcopy(item))
        if item["type"] == "message":
            self.emit("response.content_part.added", **self._where(), content_index=0,
                      part=text_part(""))
        elif item["type"] == "reasoning":
            self.emit("response.content_part.added", **self._where(), content_index=0,
                      part={"type": "reasoning_text", "text": ""})
            if self.summary:
                self.emit("response.reasoning_summary_part.added", **self._where(),
                          summary_index=0, part={"type": "summary_text", "text": ""})

    def text(self, delta: str) -> None:
        if self.open is None or self.open["type"] != "message":
            self.start(message_item("", item_id=None))
        logprobs = self.logprobs.take() if self.logprobs is not None else []
        self.open["content"][0]["text"] += delta
        self.open["content"][0]["logprobs"].extend(logprobs)
        self.emit("response.output_text.delta", **self._where(), content_index=0, delta=delta,
                  logprobs=logprobs)

    def late_logprobs(self) -> None:
        """Logprobs of the last tokens that added no text (an end token) go to the open
        message: its .done event carries them."""
        if self.logprobs is not None and self.open is not None and \
                self.open["type"] == "message":
            self.open["content"][0]["logprobs"].extend(self.logprobs.take())

    def reasoning(self, delta: str) -> None:
        if self.open is None or self.open["type"] != "reasoning":
            self.start(reasoning_item("", self.summary))
            self.open["content"] = [{"type": "reasoning_text", "text": ""}]
        self.open["content"][0]["text"] += delta
        self.emit("response.reasoning_text.delta", **self._where(), content_index=0,
                  delta=delta)
        if self.summary:  # the summary is the thinking itself (no summarizer), streamed beside it
            self.emit("response.reasoning_summary_text.delta", **self._where(), summary_index=0,
                      delta=delta)

    def call(self, call_id: str, name: str) -> None:
        self.start(call_item(call_id, name, ""))

    def arguments(self, delta: str) -> None:
        self.open["arguments"] += delta
        self.emit("response.function_call_arguments.delta", **self._where(), delta=delta)

    def close(self, status: str) -> None:
        item = self.open
        if item is None:
            return
        where, kind = self._where(), item["type"]
        if kind == "message":
            part = item["content"][0]
            self.emit("response.output_text.done", **where, content_index=0, text=part["text"],
                      logprobs=part["logprobs"])
            self.emit("response.content_part.done", **where, content_index=0, part=part)
        elif kind == "reasoning":
            part = item["content"][0]
            self.emit("response.reasoning_text.done", **where, content_index=0,
                      text=part["text"])
            self.emit("response.content_part.done", **where, content_index=0, part=part)
            if self.summary:
                summary = {"type": "summary_text", "text": part["text"]}
                self.emit("response.reasoning_summary_text.done", **where, summary_index=0,
                          text=part["text"])
                self.emit("response.reasoning_summary_part.done", **where, summary_index=0,
                          part=summary)
                item["summary"] = [summary]
        else:
            self.emit("response.function_call_arguments.done", **where, name=item["name"],
                      arguments=item["arguments"])
        item["status"] = status if kind != "reasoning" else "completed"
        self.emit("response.output_item.done", **where, item=copy.deepcopy(item))
        self.open = None


class LogprobCursor:
    """One generation's output logprobs not sent yet, in Responses' shape. Until it finishes,
    `take` stops after the last token that ends a character: a token that starts an emoji
    goes with the delta that shows it."""

    def __init__(self, built: Built, b: ResponseBuilder):
        self.built, self.b, self.sent = built, b, 0

    def take(self) -> list[dict]:
        b, start = self.b, self.sent
        end = len(b.output_logprobs)
        if finish_reason(b) is None:
            bytes_of = token_bytes(self.built.tokenizer)
            end = start + whole_characters([bytes_of.of(e[1]) for e in
                                            b.output_logprobs[start:]])
        self.sent = end
        return token_logprobs(self.built, b.output_logprobs[start:end],
                              b.output_top_logprobs[start:end])


class Splitter:
    """A choice's growing text -> its new reasoning, text and tool-call deltas."""

    def __init__(self, obj: ResponseObject, b: ResponseBuilder):
        job, tools = obj.built.job, obj.built.tools
        self.thinking = None
        if job.reasoning is not None:
            self.thinking = ReasoningStream(job.reasoning, job.reasoning.mode(b.req.input_ids))
        self.tool_deltas = tools.deltas() if tools is not None else None
        self.sent = 0

    def feed(self, b: ResponseBuilder, events: Events) -> None:
        final = finish_reason(b) is not None
        text, self.sent = b.text[self.sent:], max(self.sent, len(b.text))
        reasoning = ""
        if self.thinking is not None:
            reasoning, text = self.thinking.update(b.text, final=final)
        if reasoning:
            events.reasoning(reasoning)
        if self.tool_deltas is None:
            if text:
                events.text(text)
            return
        delta, _ = self.tool_deltas.delta({"content": text} if text else {},
                                          finish_reason(b) if final else None)
        if delta.get("content"):
            events.text(delta["content"])
        for call in delta.get("tool_calls", ()):
            if "id" in call:
                events.call(call["id"], call["function"]["name"])
            if call["function"]["arguments"]:
                events.arguments(call["function"]["arguments"])


async def response_stream(obj: ResponseObject, group: RequestGroup,
                          builders: list[ResponseBuilder],
                          on_end: Callable[[dict], None], is_cancelled: Callable[[], bool]
                          ) -> AsyncIterator[bytes]:
    """The whole SSE body; `on_end` gets the final Response object (to store it)."""
    b = builders[0]
    cursor = LogprobCursor(obj.built, b) if obj.built.logprobs else None
    events = Events(wants_summary(obj.built), cursor)
    final: dict | None = None
    events.emit("response.created", response=obj.snapshot("in_progress", []))
    events.emit("response.in_progress", response=obj.snapshot("in_progress", []))
    for chunk in events.take():
        yield chunk
    splitter = Splitter(obj, b)
    try:
        while not group.done:
            for _, out in await group.next():
                b.add(out)
            splitter.feed(b, events)
            for chunk in events.take():
                yield chunk
        status = "completed" if finish_reason(b) == "stop" else "incomplete"
        if not events.output:  # nothing was said: an empty message, as without a stream
            events.start(message_item(""))
        events.late_logprobs()
        events.close(status)
        final = obj.finished(builders, events.output, is_cancelled())
    except ServerUnavailable as exc:
        events.emit("error", code="server_error", message=str(exc), param=None)
        final = obj.snapshot("failed", events.output,
                             error={"code": "server_error", "message": str(exc)})
    finally:  # a client that hung up leaves a cancelled response behind
        on_end(final or obj.snapshot("cancelled", events.output))
    events.emit(_FINAL_EVENT[final["status"]], response=final)
    for chunk in events.take():
        yield chunk


def whole_characters(token_bytes_: list[bytes]) -> int:
    """How many of these tokens, from the first, end where a character ends (the most)."""
    utf8, whole = utf8_decoder(), 0
    for k, raw in enumerate(token_bytes_):
        utf8.decode(raw)
        if not utf8.getstate()[0]:  # no bytes of an unfinished character held
            whole = k + 1
    return whole
