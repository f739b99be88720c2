"""Pydantic models of the /v1/responses request body (OpenAI's Responses API).

Strict as openai_protocol.py is: wrong JSON types and unknown fields are 400s naming the field.
Fields that are pure bookkeeping (metadata, user, service_tier, safety_identifier,
prompt_cache_key, prompt_cache_retention, stream_options) are accepted and echoed; those
radixflow does not implement are refused by `refused_fields` with a message naming them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .openai_protocol import INT64_MAX, sampling_field

MAX_ITEMS = 4096  # input items per request
MAX_TOOLS = 128
MAX_METADATA = 16  # OpenAI: 16 pairs, keys of 64 characters, values of 512


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the model's own length: nothing to steer


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool = False  # radixflow never pads events: nothing to turn off


class ResponsesRequest(_Strict):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(max_length=MAX_ITEMS)
    instructions: str | None = None
    previous_response_id: str | None = Field(None, max_length=128)
    store: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    background: bool | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    max_output_tokens: int | None = sampling_field("max_new_tokens", ge=1)
    temperature: float | None = sampling_field("temperature", le=2.0)
    top_p: float | None = sampling_field("top_p")
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # Bookkeeping, echoed in the response.
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA)
    user: str | None = Field(None, max_length=512)
    safety_identifier: str | None = Field(None, max_length=512)
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # Not implemented: refused when set (refused_fields).
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None
    # Extensions (vLLM's Responses request takes these too).
    seed: int | None = Field(None, ge=-INT64_MAX - 1, le=INT64_MAX)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None


LOGPROBS_INCLUDE = "message.output_text.logprobs"


def wants_logprobs(body: ResponsesRequest) -> bool:
    """The output text's logprobs were asked for (top_logprobs alternatives at each token)."""
    return LOGPROBS_INCLUDE in (body.include or ())


# Set to anything but these, a field asks for what radixflow does not do.
_REFUSED = {
    "background": (None, False, "background responses are not supported; send the request "
                   "and keep the connection (stream: true to see it as it is made)"),
    "conversation": (None, None, "conversation objects are not supported; continue with "
                     "previous_response_id"),
    "prompt": (None, None, "prompt templates are not supported; send input and instructions"),
    "context_management": (None, None, "context_management is not supported"),
    "max_tool_calls": (None, None, "max_tool_calls is not supported; use "
                       "parallel_tool_calls: false for at most one call"),
    "truncation": (None, "disabled", 'truncation "auto" is not supported: an input that does '
                   "not fit the context is a 400"),
}


def refused_fields(body: ResponsesRequest) -> tuple[str, str] | None:
    """(field, message) of the first field set to something radixflow does not do."""
    for name, (none, default, message) in _REFUSED.items():
        value = getattr(body, name)
        if value is not none and value != default:
            return name, message
    for k, entry in enumerate(body.include or ()):
        if entry != LOGPROBS_INCLUDE:
            return f"include.{k}", (f"include {entry!r} is not supported: radixflow returns "
                                    f"no extra output data but {LOGPROBS_INCLUDE!r}")
    if body.top_logprobs and not wants_logprobs(body):
        return "top_logprobs", f"top_logprobs needs include: [{LOGPROBS_INCLUDE!r}]"
    for key, value in (body.metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            return f"metadata.{key[:64]}", ("metadata keys may have 64 characters and values "
                                            "512")
    return None
