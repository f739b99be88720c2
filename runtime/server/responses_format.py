"""The Response object of /v1/responses and its output items (OpenAI's shapes)."""

from __future__ import annotations

import time
from typing import Any

from ..response_builder import ResponseBuilder
from .openai_responses import chat_logprobs, finish_reason, usage
from .responses_build import Built
from .responses_items import new_id


def message_item(text: str, status: str = "completed", item_id: str | None = None,
                 logprobs: list[dict] | None = None) -> dict:
    return {"type": "message", "id": item_id or new_id("msg"), "status": status,
            "role": "assistant",
            "content": [] if text is None else [text_part(text, logprobs)]}


def text_part(text: str, logprobs: list[dict] | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def token_logprobs(built: Built, entries: list[list], tops: list[list | None]) -> list[dict]:
    """Logprob entries in Responses' shape (chat's: token, logprob, bytes, top_logprobs);
    none unless include asked for them."""
    if not built.logprobs:
        return []
    return chat_logprobs(entries, tops, built.tokenizer)["content"]


def call_item(call_id: str, name: str, arguments: str, status: str = "completed",
              item_id: str | None = None) -> dict:
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def reasoning_item(text: str | None, summary: bool, item_id: str | None = None) -> dict:
    """The thinking as reasoning_text content (and as its one summary when a summary was
    asked for: radixflow has no summarizer)."""
    item = {"type": "reasoning", "id": item_id or new_id("rs"), "summary": [], "content": []}
    if text:
        item["content"] = [{"type": "reasoning_text", "text": text}]
        if summary:
            item["summary"] = [{"type": "summary_text", "text": text}]
    return item


def wants_summary(built: Built) -> bool:
    r = built.body.reasoning
    return r is not None and (r.summary or r.generate_summary) is not None


def output_items(built: Built, b: ResponseBuilder) -> list[dict]:
    """The output of a finished generation: reasoning, text, then function calls."""
    job, status = built.job, item_status(b)
    reasoning, text = None, b.text
    if job.reasoning is not None:
        reasoning, text = job.reasoning.split(b.text, job.reasoning.mode(b.req.input_ids),
                                              final=True)
    items = [reasoning_item(reasoning, wants_summary(built))] if reasoning else []
    calls: list[dict] = []
    if built.tools is not None:
        message, _ = built.tools.message(text, finish_reason(b))
        text, calls = message["content"], message.get("tool_calls") or []
    if text or not calls:  # every generated token's logprobs ride on the message's text
        logprobs = token_logprobs(built, b.output_logprobs, b.output_top_logprobs)
        items.append(message_item(text or "", status, logprobs=logprobs))
    items.extend(call_item(c["id"], c["function"]["name"], c["function"]["arguments"], status)
                 for c in calls)
    return items


def item_status(b: ResponseBuilder) -> str:
    return "completed" if finish_reason(b) == "stop" else "incomplete"


def response_usage(built: Built, builders: list[ResponseBuilder]) -> dict:
    u = usage(built.job, builders)
    details = u.get("completion_tokens_details") or {}
    return {"input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
            "total_tokens": u["total_tokens"]}


def final_status(b: ResponseBuilder, cancelled: bool) -> tuple[str, dict | None, dict | None]:
    """(status, incomplete_details, error) of a finished generation."""
    reason = finish_reason(b)
    if reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}, None
    if reason == "abort":
        if cancelled:
            return "cancelled", None, None
        message = (b.finish_reason or {}).get("message") or "the generation was aborted"
        return "failed", None, {"code": "server_error", "message": message}
    return "completed", None, None


class ResponseObject:
    """The Response of one request: its fixed fields, set once; `snapshot` fills the rest."""

    def __init__(self, built: Built, model: str):
        body = built.body
        self.built, self.id, self.created_at = built, new_id("resp"), int(time.time())
        fmt = body.text.format if body.text is not None and body.text.format else None
        self.fixed: dict[str, Any] = {
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "model": model, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning.model_dump() if body.reasoning else
            {"effort": None, "summary": None},
            "store": body.store, "temperature": body.temperature, "top_p": body.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                     else {"type": "text"}},
            "tool_choice": _tool_choice(body.tool_choice), "tools": body.tools or [],
            "truncation": "disabled", "user": body.user, "metadata": body.metadata or {},
            "service_tier": body.service_tier or "default", "background": False,
            "safety_identifier": body.safety_identifier,
            "prompt_cache_key": body.prompt_cache_key,
        }

    def snapshot(self, status: str, output: list[dict], usage_: dict | None = None, *,
                 incomplete: dict | None = None, error: dict | None = None) -> dict:
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "error": error, "incomplete_details": incomplete,
                **self.fixed, "output": output, "usage": usage_,
                "completed_at": int(time.time()) if status == "completed" else None}

    def finished(self, builders: list[ResponseBuilder], output: list[dict],
                 cancelled: bool) -> dict:
        status, incomplete, error = final_status(builders[0], cancelled)
        return self.snapshot(status, output, response_usage(self.built, builders),
                             incomplete=incomplete, error=error)


def _tool_choice(choice: Any) -> Any:
    return "auto" if choice is None else choice
