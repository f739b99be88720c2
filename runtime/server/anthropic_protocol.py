"""Pydantic models of Anthropic's Messages API bodies: POST /v1/messages and
/v1/messages/count_tokens.

Strict as openai_protocol.py is: wrong JSON types and unknown fields are 400s naming the field.
A message's content blocks are checked one by one in anthropic_blocks.py (so that an image or
document block gets a 400 saying so), tools in anthropic_build.py (so that a server tool does).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..sampling_params import MAX_STOP_STRINGS
from .openai_protocol import sampling_field

MAX_MESSAGES = 4096
MAX_BLOCKS = 4096  # content blocks of one message
MAX_TOOLS = 128


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CacheControl(_Strict):
    """Accepted and ignored: the radix cache keeps every prefix it can without being asked."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = Field(None, max_length=0)  # radixflow cites nothing


class DirectCaller(_Strict):
    type: Literal["direct"]


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    # what the client's ToolUseBlock.model_dump() echoes back: the model called it directly
    caller: DirectCaller | None = None
    toolset_name: None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] | None = None
    is_error: bool = False
    cache_control: CacheControl | None = None
    toolset_name: None = None


class ThinkingBlock(_Strict):
    """A past turn's thinking, sent back: kept out of the prompt (chat templates drop it)."""

    type: Literal["thinking"]
    thinking: str
    signature: str
    cache_control: CacheControl | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]] = Field(max_length=MAX_BLOCKS)


class ToolChoiceAuto(_Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(_Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(_Strict):
    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
                       Field(discriminator="type")]


class Tool(_Strict):
    """A client tool (a function the caller runs); server tools are refused before this."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None  # the input always follows input_schema (constrained decoding)


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = sampling_field("thinking_budget", ..., ge=1)  # required
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive,
                     Field(discriminator="type")]


class JsonOutputFormat(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    """Structured outputs: `format` holds the text to a JSON Schema (constrained decoding)."""

    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # refused


class Metadata(_Strict):
    user_id: str | None = Field(None, max_length=256)


class CountTokensRequest(_Strict):
    """POST /v1/messages/count_tokens: what decides the prompt."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = sampling_field("max_new_tokens", ..., ge=1)  # required
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_STRINGS)
    temperature: float | None = sampling_field("temperature", le=1.0)
    top_p: float | None = sampling_field("top_p")
    top_k: int | None = sampling_field("top_k")
    stream: bool = False
    # Bookkeeping: accepted, changes nothing.
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
