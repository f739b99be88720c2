"""A /v1/responses body -> the chat request it means, and its Job.

The conversation (a stored previous response's items, then this input) is rendered as chat
messages, tools and tool_choice take chat's shapes, text.format becomes response_format, and
the whole goes through chat's own path (openai_requests.chat_job, openai_tools.plan_tools):
the same template, tool formats and constraint front door as /v1/chat/completions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..errors import InvalidRequest
from .openai_protocol import ChatCompletionRequest
from .openai_requests import BuildLimits, Job, chat_job
from .openai_tools import ToolPlan, plan_tools
from .responses import validation_error
from .responses_items import chat_messages, input_items
from .responses_protocol import ResponsesRequest, refused_fields, wants_logprobs
from .scheduler_client import SchedulerClient
from .tool_parsers import ToolParser

# Hosted tools OpenAI runs on its side; radixflow runs none of them.
_FUNCTION = "function"


@dataclass
class Built:
    """Everything a response is made of, built off the event loop."""

    body: ResponsesRequest
    items: list[dict[str, Any]]  # the conversation's input items, previous turns first
    chat: ChatCompletionRequest
    tools: ToolPlan | None
    job: Job
    tokenizer: Any  # the model's: logprobs' tokens and bytes (token_bytes.py)

    @property
    def logprobs(self) -> bool:
        return self.chat.logprobs is True


def check_refused(body: ResponsesRequest) -> None:
    refused = refused_fields(body)
    if refused is not None:
        raise InvalidRequest(f"{refused[0]}: {refused[1]}", param=refused[0])


def build(client: SchedulerClient, body: ResponsesRequest, history: list[dict[str, Any]],
          tool_parser: ToolParser | None, limits: BuildLimits) -> Built:
    """The job of `body` continuing `history` (a stored response's items, or [])."""
    items = [*history, *input_items(body.input)]
    fields: dict[str, Any] = {
        "model": body.model, "messages": chat_messages(body.instructions, items),
        "stream": body.stream, "tools": chat_tools(body.tools),
        "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": response_format(body),
        # as chat's reasoning_effort: a thinking budget with a reasoning parser, else nothing
        "reasoning_effort": body.reasoning.effort if body.reasoning is not None else None}
    for name in ("temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty",
                 "stop"):
        fields[name] = getattr(body, name)
    fields["max_completion_tokens"] = body.max_output_tokens
    if wants_logprobs(body):
        fields["logprobs"], fields["top_logprobs"] = True, body.top_logprobs or 0
    try:
        chat = ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    tools = plan_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls, tool_parser)
    job = chat_job(client, chat, tools, tool_parser, limits)
    return Built(body, items, chat, tools, job, client.tokenizer)


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools ({"type": "function", "name", "parameters", ...}) in
    chat's shape; any other tool type is a 400 naming it."""
    if tools is None:
        return None
    out = []
    for k, tool in enumerate(tools):
        where = f"tools.{k}"
        kind = tool.get("type")
        if kind != _FUNCTION:
            raise InvalidRequest(f"{where}: tools of type {kind!r} are not supported; "
                                 "radixflow runs function tools only", param=f"{where}.type")
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise InvalidRequest(f"{where}: unknown field {sorted(unknown)[0]!r}",
                                 param=f"{where}.{sorted(unknown)[0]}")
        if tool.get("strict") not in (None, True, False):
            raise InvalidRequest(f"{where}.strict must be a boolean", param=f"{where}.strict")
        function = {key: tool[key] for key in ("name", "description", "parameters")
                    if tool.get(key) is not None}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise InvalidRequest('tool_choice must be "none", "auto", "required" or '
                                 '{"type": "function", "name": ...}', param="tool_choice")
        return choice
    if choice.get("type") != _FUNCTION:
        raise InvalidRequest(f"tool_choice of type {choice.get('type')!r} is not supported "
                             '(use "none", "auto", "required" or {"type": "function", '
                             '"name": ...})', param="tool_choice.type")
    if not isinstance(choice.get("name"), str) or set(choice) - {"type", "name"}:
        raise InvalidRequest('tool_choice must be {"type": "function", "name": ...}',
                             param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    """text.format as chat's response_format (the same constraint front door)."""
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None or not fmt.name:
        raise InvalidRequest("text.format of type json_schema needs name and schema",
                             param="text.format.schema" if fmt.name else "text.format.name")
    spec = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict,
            "description": fmt.description}
    return {"type": "json_schema",
            "json_schema": {k: v for k, v in spec.items() if v is not None}}
