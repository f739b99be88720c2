"""Pydantic models of the OpenAI-compatible requests we accept.

Strict: wrong JSON types and unknown fields are 400s naming the field, as OpenAI does. A few
well-known extensions of vLLM/SGLang (top_k, min_p, ignore_eos, regex, ...) are accepted.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..sampling_params import MAX_NEW_TOKENS_LIMIT

INT64_MAX = (1 << 63) - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Strict):
    name: str = Field("response", max_length=256)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class _SamplingRequest(_Strict):
    model: str = Field(min_length=1)
    n: int = Field(1, ge=1, le=128)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(None, ge=-INT64_MAX - 1, le=INT64_MAX)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    logit_bias: Optional[dict[str, float]] = None
    response_format: Optional[ResponseFormat] = None
    # Extensions (vLLM / SGLang names).
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=MAX_NEW_TOKENS_LIMIT)
    stop_token_ids: Optional[list[int]] = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    json_schema: Optional[Union[str, dict[str, Any]]] = None


class CompletionRequest(_SamplingRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = Field(16, ge=0, le=MAX_NEW_TOKENS_LIMIT)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    suffix: Optional[str] = None
    best_of: Optional[int] = Field(None, ge=1, le=128)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Not forbidding extras: clients echo assistant messages back with fields such as
    # `refusal`, `audio` or `annotations` that do not affect the prompt.
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None
    tool_call_id: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1, le=MAX_NEW_TOKENS_LIMIT)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=MAX_NEW_TOKENS_LIMIT)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    # Extensions.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
