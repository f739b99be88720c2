"""Pydantic models of the OpenAI-compatible requests we accept.

Strict: wrong JSON types and unknown fields are 400s naming the field, as OpenAI does. The
documented extensions of vLLM and SGLang are accepted: sampling (top_k, min_p, ignore_eos, ...),
constraints (SGLang's regex / ebnf / json_schema, vLLM's guided_* and structured_outputs),
priority / cache_salt / routed_dp_rank, and vLLM's /tokenize and /detokenize bodies. Every
field of OpenAI's own is declared here, those refused too (openai_fields.py says what each
does; validate_body refuses them by name).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..sampling_params import MAX_NEW_TOKENS_LIMIT, OPTIONS

INT64_MAX = (1 << 63) - 1
_SETS = "radixflow_sets"  # the json_schema_extra key naming the option a field sets


def sampling_field(option: str, default: Any = None, **narrower: float) -> Any:
    """A request field that sets SamplingParams' `option`: the field's name is the option's
    OpenAI name, its bounds are the option's, or `narrower` ones (ge=, le=, gt=, lt=) where
    this API allows less (temperature: OpenAI documents [0, 2])."""
    rule = OPTIONS[option].rule
    bounds = {**(rule.schema_bounds() if rule is not None else {}), **narrower}
    return Field(default, json_schema_extra={_SETS: option}, **bounds)


@functools.cache
def sampling_names(model: type[BaseModel]) -> Mapping[str, str]:
    """Request field -> the SamplingParams option it sets, for `model`'s sampling fields, in
    declaration order (of two fields setting one option, the later one given wins)."""
    return MappingProxyType({
        name: info.json_schema_extra[_SETS] for name, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and _SETS in info.json_schema_extra})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM
    include_obfuscation: bool = False  # OpenAI's: a no-op (no obfuscation field is sent)


class JsonSchemaFormat(_Strict):
    name: str = Field("response", max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs`: one constraint."""

    json_: str | dict[str, Any] | None = Field(None, alias="json")  # (BaseModel has .json)
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    json_object: bool | None = None


class _SamplingRequest(_Strict):
    """What completions and chat share. A `sampling_field` is a sampling option under its
    OpenAI name (openai_requests.py maps them all by `sampling_names`)."""

    model: str = Field(min_length=1)
    n: int = sampling_field("n", 1)
    stop: str | list[str] | None = sampling_field("stop")
    seed: int | None = sampling_field("seed", ge=-INT64_MAX - 1, le=INT64_MAX)
    temperature: float | None = sampling_field("temperature", le=2.0)
    top_p: float | None = sampling_field("top_p")
    frequency_penalty: float | None = sampling_field("frequency_penalty")
    presence_penalty: float | None = sampling_field("presence_penalty")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = sampling_field("logit_bias")
    response_format: ResponseFormat | None = None
    # Extensions (vLLM / SGLang names).
    top_k: int | None = sampling_field("top_k")
    min_p: float | None = sampling_field("min_p")
    repetition_penalty: float | None = sampling_field("repetition_penalty")
    ignore_eos: bool = sampling_field("ignore_eos", False)
    # radixflow: close constrained outputs within max_tokens
    budget_safe: bool = sampling_field("budget_safe", True)
    max_repeat_run: int | None = sampling_field("max_repeat_run")  # radixflow: constrained loops
    min_tokens: int = sampling_field("min_new_tokens", 0, le=MAX_NEW_TOKENS_LIMIT)
    stop_token_ids: list[int] | None = sampling_field("stop_token_ids")
    skip_special_tokens: bool = sampling_field("skip_special_tokens", True)
    no_stop_trim: bool = sampling_field("no_stop_trim", False)
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | dict[str, Any] | None = None
    # vLLM's constraint names (openai_constraints.py maps them).
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    structured_outputs: StructuredOutputs | None = None
    # When and where it runs (native_placement.py): vLLM's and SGLang's names.
    priority: int | None = None
    cache_salt: str | None = None
    routed_dp_rank: int | None = None  # SGLang
    data_parallel_rank: int | None = None  # SGLang's deprecated name of routed_dp_rank
    # radixflow: speculative decoding on or off for this request (speculation_fields.py)
    speculative: bool | None = None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = sampling_field("max_new_tokens", 16)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=128)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Not forbidding extras: clients echo assistant messages back with fields such as
    # `refusal`, `audio` or `annotations` that do not affect the prompt.
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        """An image, audio or file part gets a 400 that says so (not a type error)."""
        if isinstance(content, list):
            for k, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(f"part {k} is of type {kind!r}: not supported; radixflow "
                                     f"serves text only (content parts of type 'text')")
        return content

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class Prediction(_Strict):
    type: Literal["content"]
    content: str | list[TextPart]


class PromptCacheOptions(_Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = sampling_field("max_new_tokens", ge=1)
    max_completion_tokens: int | None = sampling_field("max_new_tokens", ge=1)  # wins if given
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # Extensions.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # Reasoning models (--reasoning-parser), SGLang's names: the thinking goes to
    # reasoning_content unless separate_reasoning is false; thinking_budget caps it (tokens).
    separate_reasoning: bool = True
    stream_reasoning: bool = True  # false: the reasoning in one chunk, when it is complete
    thinking_budget: int | None = sampling_field("thinking_budget")
    # OpenAI's other fields (openai_fields.py says what each does here).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh",
                              "max"] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    safety_identifier: str | None = Field(None, max_length=128)
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prediction: Prediction | None = None
    modalities: list[Literal["text", "audio"]] | None = Field(None, max_length=2)
    verbosity: Literal["low", "medium", "high"] | None = None
    # Refused when set (a 400 saying why): typed loosely so the refusal, not a type error,
    # is what the client reads.
    audio: Any = None
    web_search_options: Any = None
    moderation: Any = None
    functions: Any = None
    function_call: Any = None


class TokenizeRequest(_Strict):
    """POST /tokenize: vLLM's body (a prompt, or chat messages) and SGLang's (a prompt or a
    list of prompts)."""

    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    """POST /detokenize: `tokens` (one list, or SGLang's list of lists)."""

    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True
