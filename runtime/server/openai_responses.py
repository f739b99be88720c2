"""OpenAI response bodies and the one SSE loop of /v1/completions and /v1/chat/completions.

A `CompletionFormat` or `ChatFormat` knows its endpoint's shapes (the final object, the
stream's opening chunks, a choice's delta); `openai_stream` does the rest for both.
"""

from __future__ import annotations

import codecs
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..errors import ServerUnavailable
from ..reasoning import ReasoningStream
from ..response_builder import ResponseBuilder
from ..token_bytes import token_bytes, token_display
from .openai_protocol import ChatCompletionRequest, CompletionRequest
from .openai_requests import Job
from .openai_tools import ToolDeltas, ToolPlan
from .responses import SSE_DONE, error_body, sse
from .scheduler_client import RequestGroup

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class Delta:
    """What one choice gained since its previous chunk."""

    index: int
    text: str
    text_offset: int  # where `text` starts in the choice's whole text
    logprobs: list[list]  # output logprob entries, as ResponseBuilder keeps them
    top_logprobs: list[list | None]
    finish_reason: str | None


class _Format(ABC):
    """What both endpoints share: ids, the chunk envelope, usage."""

    object_name: str  # of the non-stream object
    chunk_name: str  # of a stream chunk

    def __init__(self, job: Job, model: str, id_prefix: str, include_usage: bool,
                 tokenizer: Any):
        self.job, self.model, self.include_usage = job, model, include_usage
        self.tokenizer = tokenizer  # logprobs: each token's own bytes (token_bytes.py)
        self.id, self.created = f"{id_prefix}-{uuid.uuid4().hex}", int(time.time())

    def envelope(self, name: str, choices: list[dict], usage: dict | None) -> dict:
        return {"id": self.id, "object": name, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage}

    def result(self, builders: list[ResponseBuilder]) -> dict:
        choices = [self.choice(i, b) for i, b in enumerate(builders)]
        return self.envelope(self.object_name, mark_closed(choices, builders),
                             usage(self.job, builders))

    def chunk(self, choices: list[dict], usage: dict | None = None) -> bytes:
        return sse(self.envelope(self.chunk_name, choices, usage))

    async def opening(self, group: RequestGroup, builders: list[ResponseBuilder]
                      ) -> AsyncIterator[list[dict]]:
        """The choices of each chunk sent before the deltas: none by default."""
        return
        yield  # NOTE: makes this an (empty) async generator

    @abstractmethod
    def choice(self, index: int, b: ResponseBuilder) -> dict:
        """Choice `index` of the non-stream object."""

    @abstractmethod
    def delta_choice(self, d: Delta) -> dict | None:
        """The chunk choice for `d`, or None when it is not worth a chunk."""


class CompletionFormat(_Format):
    object_name = chunk_name = "text_completion"

    def __init__(self, job: Job, model: str, body: CompletionRequest, tokenizer: Any):
        super().__init__(job, model, "cmpl", _include_usage(body), tokenizer)
        self.logprobs, self.echo = body.logprobs, body.echo
        # a streamed choice's bytes not yet whole characters, across its chunks
        self._utf8: dict[int, codecs.IncrementalDecoder] = {}

    def choice(self, index: int, b: ResponseBuilder) -> dict:
        prefix = self.job.prompt_texts[index // self.job.n] if self.echo else ""
        logprobs = None
        if self.logprobs is not None:
            entries, tops = b.output_logprobs, b.output_top_logprobs
            if self.echo:
                entries, tops = b.input_logprobs + entries, b.input_top_logprobs + tops
            logprobs = completion_logprobs(entries, tops, 0, self.tokenizer, utf8_decoder())
        return {"index": index, "text": prefix + b.text, "logprobs": logprobs,
                "finish_reason": finish_reason(b)}

    def delta_choice(self, d: Delta) -> dict | None:
        # a chunk of tokens that end inside a character has no text yet, but its logprobs
        if not d.text and d.finish_reason is None and not (self.logprobs is not None
                                                           and d.logprobs):
            return None
        logprobs = None
        if self.logprobs is not None:
            utf8 = self._utf8.setdefault(d.index, utf8_decoder())
            logprobs = completion_logprobs(d.logprobs, d.top_logprobs, d.text_offset,
                                           self.tokenizer, utf8)
        return {"index": d.index, "text": d.text, "logprobs": logprobs,
                "finish_reason": d.finish_reason}


class ChatFormat(_Format):
    object_name, chunk_name = "chat.completion", "chat.completion.chunk"

    def __init__(self, job: Job, model: str, body: ChatCompletionRequest,
                 tools: ToolPlan | None, tokenizer: Any):
        super().__init__(job, model, "chatcmpl", _include_usage(body), tokenizer)
        self.logprobs, self.tools = bool(body.logprobs), tools
        self._tool_deltas: dict[int, ToolDeltas] = {}  # per streamed choice
        self.reasoning, self.stream_reasoning = job.reasoning, body.stream_reasoning
        self._reasoning_streams: dict[int, tuple[ReasoningStream, list[str]]] = {}

    def _split(self, index: int, b: ResponseBuilder) -> tuple[str | None, str]:
        """(reasoning_content, content) of a finished choice."""
        if self.reasoning is None:
            return None, b.text
        mode = self.reasoning.mode(self.job.reqs[index].input_ids)
        return self.reasoning.split(b.text, mode, final=True)

    def _reasoning_delta(self, d: Delta) -> dict:
        """The delta's reasoning_content and content (reasoning models)."""
        if d.index not in self._reasoning_streams:
            mode = self.reasoning.mode(self.job.reqs[d.index].input_ids)
            stream = ReasoningStream(self.reasoning, mode, hold=not self.stream_reasoning)
            self._reasoning_streams[d.index] = (stream, [""])
        stream, text = self._reasoning_streams[d.index]
        text[0] += d.text  # the choice's text so far
        reasoning, content = stream.update(text[0], final=d.finish_reason is not None)
        delta = {"reasoning_content": reasoning} if reasoning else {}
        if content:
            delta["content"] = content
        return delta

    def _logprobs(self, entries: list[list], tops: list[list | None]) -> dict | None:
        return chat_logprobs(entries, tops, self.tokenizer) if self.logprobs else None

    def choice(self, index: int, b: ResponseBuilder) -> dict:
        reasoning, text = self._split(index, b)
        message, finish = {"role": "assistant", "content": text}, finish_reason(b)
        if self.tools is not None:
            message, finish = self.tools.message(text, finish)
        if self.reasoning is not None:
            message["reasoning_content"] = reasoning
        return {"index": index, "message": message,
                "logprobs": self._logprobs(b.output_logprobs, b.output_top_logprobs),
                "finish_reason": finish}

    async def opening(self, group: RequestGroup, builders: list[ResponseBuilder]
                      ) -> AsyncIterator[list[dict]]:
        """The role of every choice."""
        yield [{"index": i, "delta": {"role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None} for i in range(len(builders))]

    def delta_choice(self, d: Delta) -> dict | None:
        logprobs = self._logprobs(d.logprobs, d.top_logprobs)
        if self.reasoning is not None:
            delta = self._reasoning_delta(d)
        else:
            delta = {"content": d.text} if d.text else {}
        finish = d.finish_reason
        if self.tools is not None:  # the content parsed into text and tool_calls deltas
            if d.index not in self._tool_deltas:
                self._tool_deltas[d.index] = self.tools.deltas()
            delta, finish = self._tool_deltas[d.index].delta(delta, finish)
        if not delta and finish is None and not logprobs:
            return None
        return {"index": d.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


async def openai_stream(fmt: CompletionFormat | ChatFormat, group: RequestGroup,
                        builders: list[ResponseBuilder]) -> AsyncIterator[bytes]:
    """The SSE body: opening chunks, then a chunk per choice per step that changed it, the
    usage when asked for, and [DONE] (after a 503 error event if the server failed)."""
    sent_text = [0] * len(builders)
    sent_logprobs = [0] * len(builders)
    try:
        async for choices in fmt.opening(group, builders):
            yield fmt.chunk(mark_closed(choices, builders))
        while not group.done:
            items = await group.next()
            for i, out in items:
                builders[i].add(out)
            for i in dict.fromkeys(i for i, _ in items):
                b, text_from, lp_from = builders[i], sent_text[i], sent_logprobs[i]
                sent_text[i], sent_logprobs[i] = max(text_from, len(b.text)), len(b.output_logprobs)
                choice = fmt.delta_choice(Delta(
                    index=i, text=b.text[text_from:], text_offset=text_from,
                    logprobs=b.output_logprobs[lp_from:],
                    top_logprobs=b.output_top_logprobs[lp_from:], finish_reason=finish_reason(b)))
                if choice is not None:
                    yield fmt.chunk(mark_closed([choice], builders))
        if fmt.include_usage:
            yield fmt.chunk([], usage(fmt.job, builders))
    except ServerUnavailable as exc:
        yield sse(error_body(503, str(exc)))
    yield SSE_DONE


def _include_usage(body: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def usage(job: Job, builders: list[ResponseBuilder]) -> dict:
    firsts = [builders[p * job.n] for p in range(len(job.prompts))]  # one per prompt
    prompt = sum(b.prompt_tokens for b in firsts)
    completion = sum(b.completion_tokens for b in builders)
    out = {"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": sum(b.cached_tokens for b in firsts)}}
    details = {}
    if job.reasoning is not None:  # reasoning models: the thinking's tokens, markers included
        details["reasoning_tokens"] = sum(
            job.reasoning.reasoning_tokens(job.reasoning.mode(b.req.input_ids), b.output_ids)
            for b in builders)
    if any(b.req.prediction_ids for b in builders):  # Predicted Outputs: drafted from it
        specs = [b.spec for b in builders if b.spec is not None]
        accepted = sum(s.prediction_accepted_tokens for s in specs)
        details["accepted_prediction_tokens"] = accepted
        details["rejected_prediction_tokens"] = sum(
            s.prediction_draft_tokens for s in specs) - accepted
    if details:
        out["completion_tokens_details"] = details
    return out


def mark_closed(choices: list[dict], builders: list[ResponseBuilder]) -> list[dict]:
    """`closed_early: true` on each finished choice whose output budget-safe closing ended
    (runtime/constrained/closing.py); absent otherwise. OpenAI clients ignore unknown fields."""
    for choice in choices:
        if choice.get("finish_reason") and builders[choice["index"]].closed_early:
            choice["closed_early"] = True
    return choices


def finish_reason(b: ResponseBuilder) -> str | None:
    if b.finish_reason is None:
        return None
    return _FINISH.get(b.finish_reason["type"], "stop")


def utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def _token(tokenizer: Any, tid: int) -> tuple[str, bytes]:
    """(OpenAI's `token` text, the token's bytes)."""
    raw = token_bytes(tokenizer).of(tid)
    return token_display(raw), raw


def chat_logprobs(entries: list[list], tops: list[list | None], tokenizer: Any) -> dict:
    content = []
    for k, (lp, tid, _) in enumerate(entries):
        top = tops[k] if k < len(tops) and tops[k] else []
        token, raw = _token(tokenizer, tid)
        alternatives = []
        for tl, top_id, _ in top:
            top_token, top_raw = _token(tokenizer, top_id)
            alternatives.append({"token": top_token, "logprob": tl, "bytes": list(top_raw)})
        content.append({"token": token, "logprob": lp, "bytes": list(raw),
                        "top_logprobs": alternatives})
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[list], tops: list[list | None], offset: int,
                        tokenizer: Any, utf8: codecs.IncrementalDecoder) -> dict:
    """The legacy logprobs object. A token's `text_offset` is where the character its first
    byte belongs to starts: tokens that share a character (an emoji's bytes) share its offset.
    `utf8` holds the choice's incomplete character from earlier chunks."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for k, (lp, tid, _) in enumerate(entries):
        token, raw = _token(tokenizer, tid)
        tokens.append(token)
        token_logprobs.append(lp)
        top = tops[k] if k < len(tops) else None
        top_logprobs.append(None if top is None else
                            {_token(tokenizer, top_id)[0]: tl for tl, top_id, _ in top})
        text_offset.append(offset)
        offset += len(utf8.decode(raw))
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}
