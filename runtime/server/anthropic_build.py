"""A Messages body -> the chat request it means, and its Job.

The system prompt and messages become chat messages (anthropic_blocks), tools and tool_choice
take chat's shapes, thinking becomes chat's thinking_budget, and the whole goes through chat's
own path (openai_tools.plan_tools, openai_requests.chat_job / render_chat): the same template,
tool formats and constraint front door as /v1/chat/completions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..errors import InvalidRequest
from .anthropic_blocks import chat_messages, prefilled, validated
from .anthropic_protocol import CountTokensRequest, MessagesRequest, Tool, ToolChoiceTool
from .openai_protocol import ChatCompletionRequest
from .openai_requests import BuildLimits, Job, chat_job, render_chat
from .openai_tools import ToolPlan, plan_tools
from .responses import validation_error
from .scheduler_client import SchedulerClient
from .tool_parsers import ToolParser

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
# Messages field -> the chat field it is
_SAMPLING = {"max_tokens": "max_completion_tokens", "temperature": "temperature",
             "top_p": "top_p", "top_k": "top_k", "stop_sequences": "stop"}


@dataclass
class Built:
    """Everything a message is made of, built off the event loop."""

    body: MessagesRequest
    chat: ChatCompletionRequest
    tools: ToolPlan | None
    job: Job

    @property
    def omit_thinking(self) -> bool:
        """thinking.display "omitted": thinking blocks come empty."""
        return getattr(self.body.thinking, "display", None) == "omitted"


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Client tools in chat's shape; a server tool (web search, bash, ...) is a 400."""
    if tools is None:
        return None
    out = []
    for k, raw in enumerate(tools):
        where = f"tools.{k}"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind not in (None, "custom"):
            raise InvalidRequest(f"{where}: tools of type {kind!r} (Anthropic's server tools) "
                                 "are not supported; radixflow takes client tools: name, "
                                 "description, input_schema", param=f"{where}.type")
        tool = validated(Tool, raw, where)
        if not _NAME_RE.fullmatch(tool.name):
            raise InvalidRequest(f"{where}.name must be 1-64 letters, digits, '_' or '-'",
                                 param=f"{where}.name")
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(body: CountTokensRequest) -> dict[str, Any]:
    """tool_choice as chat's tool_choice and parallel_tool_calls."""
    choice = body.tool_choice
    if choice is None:
        return {}
    if isinstance(choice, ToolChoiceTool):
        chat_choice: Any = {"type": "function", "function": {"name": choice.name}}
    else:
        chat_choice = _CHOICE[choice.type]
    parallel = False if getattr(choice, "disable_parallel_tool_use", False) else None
    return {"tool_choice": chat_choice, "parallel_tool_calls": parallel}


def thinking_budget(client: SchedulerClient, body: CountTokensRequest) -> int | None:
    """thinking as chat's thinking_budget: disabled ends the thinking at once (nothing to
    disable on a server without a reasoning parser), enabled caps it at budget_tokens,
    adaptive lets the model think as long as it likes."""
    thinking = body.thinking
    if thinking is None:
        return None
    if thinking.type == "disabled":
        return 0 if client.reasoning is not None else None
    if client.reasoning is None:
        raise InvalidRequest(f"thinking {{'type': {thinking.type!r}}} needs a reasoning model, a "
                             "server started with --reasoning-parser; this one has none (send "
                             "{'type': 'disabled'} or leave thinking out)", param="thinking")
    if thinking.type == "adaptive":
        return None
    max_tokens = getattr(body, "max_tokens", None)
    if max_tokens is not None and thinking.budget_tokens >= max_tokens:
        raise InvalidRequest(f"thinking.budget_tokens ({thinking.budget_tokens}) must be less "
                             f"than max_tokens ({max_tokens})", param="thinking.budget_tokens")
    return thinking.budget_tokens


def response_format(body: CountTokensRequest) -> dict[str, Any] | None:
    """output_config.format as chat's response_format (the same constraint front door)."""
    config = body.output_config
    if config is None:
        return None
    if config.effort is not None:
        raise InvalidRequest("output_config.effort is not supported; on a reasoning model set "
                             "thinking.budget_tokens", param="output_config.effort")
    if config.format is None:
        return None
    return {"type": "json_schema",
            "json_schema": {"name": "output", "schema": config.format.schema_}}


def chat_request(client: SchedulerClient, body: CountTokensRequest) -> ChatCompletionRequest:
    messages = chat_messages(body.system, body.messages)
    cont = prefilled(messages)
    fields: dict[str, Any] = {
        "model": body.model, "messages": messages, "tools": chat_tools(body.tools),
        **chat_tool_choice(body), "thinking_budget": thinking_budget(client, body),
        "continue_final_message": cont, "add_generation_prompt": not cont}
    if isinstance(body, MessagesRequest):
        fields["stream"], fields["response_format"] = body.stream, response_format(body)
        fields.update({chat: getattr(body, name) for name, chat in _SAMPLING.items()})
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _plan(chat: ChatCompletionRequest, parser: ToolParser | None) -> ToolPlan | None:
    return plan_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls, parser)


def build(client: SchedulerClient, body: MessagesRequest, parser: ToolParser | None,
          limits: BuildLimits) -> Built:
    """The job of a /v1/messages body (renders and tokenizes: call it off the event loop)."""
    chat = chat_request(client, body)
    tools = _plan(chat, parser)
    return Built(body, chat, tools, chat_job(client, chat, tools, parser, limits))


def count_tokens(client: SchedulerClient, body: CountTokensRequest, parser: ToolParser | None,
                 limits: BuildLimits) -> int:
    """The prompt's length in tokens, as /v1/messages would build it."""
    chat = chat_request(client, body)
    text = render_chat(client.tokenizer, chat, _plan(chat, parser), parser, limits)
    return len(client.tokenizer.encode(text, add_special_tokens=False))
