"""A chat body's prompt text: the model's chat template over its messages (and tools), with
the client's `chat_template_kwargs` checked to be template variables only, under a time limit
and a size limit."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ..errors import InvalidRequest
from .build_limits import NO_LIMITS, BuildLimits
from .deadline import TimedOut, run_with_deadline
from .openai_protocol import ChatCompletionRequest
from .openai_tools import ToolPlan, with_tools
from .tool_parsers import ToolParser

# apply_chat_template's own arguments, and what the server passes itself: a client's
# chat_template_kwargs may only hold the template's variables (enable_thinking, ...).
_NOT_TEMPLATE_VARIABLES = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "sanitize_control_tokens", "tokenizer", "processor_kwargs",
})
_REQUEST_FIELDS = ("add_generation_prompt", "continue_final_message", "tools", "messages")


@functools.lru_cache(maxsize=8)
def _template_arguments(tokenizer_type: type) -> frozenset[str]:
    """The named parameters of `tokenizer_type.apply_chat_template`."""
    try:
        params = inspect.signature(tokenizer_type.apply_chat_template).parameters
    except (AttributeError, TypeError, ValueError):
        return frozenset()
    return frozenset(name for name, p in params.items()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self")


def template_variables(tokenizer: Any, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """A client's `chat_template_kwargs`, checked: a 400 naming the first key that is not a
    template variable (a template of its own, a tokenizer option, a field the server sets)."""
    if not kwargs:
        return {}
    reserved = _NOT_TEMPLATE_VARIABLES | _template_arguments(type(tokenizer))
    for key in kwargs:
        param = f"chat_template_kwargs.{key}"
        if key == "chat_template":
            raise InvalidRequest("chat_template_kwargs may not carry a chat template: the "
                                 "server renders with the model's template, or the one its "
                                 "operator set with --chat-template", param=param)
        if key in _REQUEST_FIELDS:
            raise InvalidRequest(f"chat_template_kwargs may not set {key!r}: it is the "
                                 f"request's own field", param=param)
        if key in reserved:
            raise InvalidRequest(f"chat_template_kwargs may only hold template variables; "
                                 f"{key!r} is an option of the tokenizer's "
                                 f"apply_chat_template", param=param)
        if not key.isidentifier() or key.startswith("_"):
            raise InvalidRequest(f"chat_template_kwargs key {key!r} is not a template variable "
                                 f"name", param=param)
    return kwargs


def render_chat(tokenizer: Any, body: ChatCompletionRequest, tools: ToolPlan | None = None,
                tool_parser: ToolParser | None = None,
                limits: BuildLimits = NO_LIMITS) -> str:
    """The prompt text: the model's chat template applied to the messages (and tools; past
    tool calls in `tool_parser`'s format). The render is stopped past limits.render_timeout
    and its text refused past limits.max_rendered_chars (400s)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest("this model has no chat template; use /v1/completions",
                             param="messages")
    variables = template_variables(tokenizer, body.chat_template_kwargs)
    messages = []
    for m in body.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        messages.append(msg)
    messages, tool_kwargs = with_tools(tokenizer, messages, body.messages, tools, tool_parser)
    continue_final = body.continue_final_message
    if continue_final and body.messages[-1].role != "assistant":
        raise InvalidRequest("continue_final_message needs a final assistant message",
                             param="continue_final_message")

    def render() -> str:
        return tokenizer.apply_chat_template(
            messages, tokenize=False,
            add_generation_prompt=body.add_generation_prompt and not continue_final,
            continue_final_message=continue_final, **tool_kwargs, **variables)

    try:
        text = run_with_deadline(render, limits.render_timeout)
    except TimedOut:
        raise InvalidRequest(f"rendering the chat template took longer than "
                             f"{limits.render_timeout:g} s, the limit; send fewer or shorter "
                             f"messages", param="messages") from None
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001 -- any template error (jinja, raise_exception)
        raise InvalidRequest(f"the chat template rejected the messages: {exc}",
                             param="messages") from None
    if limits.max_rendered_chars is not None and len(text) > limits.max_rendered_chars:
        raise InvalidRequest(f"the rendered chat prompt has {len(text)} characters; the limit "
                             f"is {limits.max_rendered_chars}", param="messages")
    return text
