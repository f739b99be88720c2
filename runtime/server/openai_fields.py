"""Every field of OpenAI's chat and completions requests, and what radixflow does with it.

CHAT_FIELDS / COMPLETION_FIELDS name each field of the openai package's
`chat.completions.create` / `completions.create` params (tests walk its TypedDicts, so a new
OpenAI field that is neither here nor in the request models fails them) with its treatment:

- served: implemented with OpenAI's meaning;
- no-op: pure bookkeeping (or a hint): accepted and validated, changes nothing;
- unused: accepted, its effect would need a part radixflow does not have;
- refused: a 400 naming the field and why, when set (`check_refused`).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InvalidRequest

SERVED, NO_OP, UNUSED, REFUSED = "served", "no-op", "unused", "refused"

_COMMON = {
    "model": (SERVED, "a --served-model-name, or the model path"),
    "frequency_penalty": (SERVED, ""), "presence_penalty": (SERVED, ""),
    "logit_bias": (SERVED, "token id -> bias in [-100, 100]"),
    "n": (SERVED, "choices, each its own request"),
    "seed": (SERVED, "choice k draws from seed + k"),
    "stop": (SERVED, "strings cut from the text"),
    "stream": (SERVED, "server-sent events"),
    "stream_options": (SERVED, "include_usage; include_obfuscation is a no-op (no "
                               "obfuscation field is sent)"),
    "temperature": (SERVED, "[0, 2]"), "top_p": (SERVED, ""),
    "max_tokens": (SERVED, ""),
    "user": (NO_OP, "bookkeeping"),
}
COMPLETION_FIELDS: dict[str, tuple[str, str]] = {
    **_COMMON,
    "prompt": (SERVED, "a string, strings, token ids or lists of them"),
    "best_of": (SERVED, "equal to n (or omitted): no server-side ranking"),
    "echo": (SERVED, "not with stream"),
    "logprobs": (SERVED, "top alternatives, at most 5; a token holding part of a character "
                         "reads \\xNN for those bytes"),
    "suffix": (REFUSED, "no insertion (fill-in-the-middle) mode"),
}
CHAT_FIELDS: dict[str, tuple[str, str]] = {
    **_COMMON,
    "messages": (SERVED, "rendered by the model's chat template"),
    "max_completion_tokens": (SERVED, "wins over max_tokens"),
    "logprobs": (SERVED, "each token's own `bytes` (a character split over tokens joins back)"),
    "top_logprobs": (SERVED, "at most 20"),
    "response_format": (SERVED, "json_schema, json_object, text"),
    "tools": (SERVED, "function tools, by constrained decoding"),
    "tool_choice": (SERVED, ""), "parallel_tool_calls": (SERVED, ""),
    "reasoning_effort": (SERVED, "with --reasoning-parser: a thinking budget (below); "
                                 "without one a no-op"),
    "store": (NO_OP, "nothing is stored: chat completions cannot be listed or retrieved"),
    "metadata": (NO_OP, "checked as OpenAI does: at most 16 pairs, keys of at most 64 "
                        "characters, values of at most 512"),
    "service_tier": (NO_OP, "one tier: every request is served alike"),
    "safety_identifier": (NO_OP, "bookkeeping (at most 128 characters)"),
    "prompt_cache_key": (NO_OP, "a hint: the radix cache reuses every shared prefix anyway"),
    "prompt_cache_options": (NO_OP, "a hint: the radix cache keeps prefixes until evicted"),
    "prompt_cache_retention": (NO_OP, "a hint: the radix cache keeps prefixes until evicted"),
    "prediction": (SERVED, "drafted first by the n-gram speculative decoder (on for the "
                           "request); usage says accepted/rejected_prediction_tokens"),
    "modalities": (SERVED, '["text"] only; "audio" is refused'),
    "verbosity": (SERVED, '"medium" (what a model does unasked) only; "low" and "high" are '
                          "refused"),
    "audio": (REFUSED, "no audio output: this server generates text only"),
    "web_search_options": (REFUSED, "no web search tool: radixflow runs function tools only"),
    "moderation": (REFUSED, "no moderation model runs here"),
    "functions": (REFUSED, "deprecated by OpenAI; send tools"),
    "function_call": (REFUSED, "deprecated by OpenAI; send tool_choice"),
}

# reasoning_effort -> thinking budget (tokens); "max": no budget.
EFFORT_BUDGET: dict[str, int | None] = {"low": 1024, "medium": 4096, "high": 16384,
                                        "xhigh": 32768, "max": None}
EFFORT_OFF = ("none", "minimal")  # thinking off
# The template variables that switch thinking off: Qwen3's / GLM's, DeepSeek-V3.1's.
_SWITCHES = ("enable_thinking", "thinking")


def check_refused(body: Any, fields: dict[str, tuple[str, str]]) -> None:
    """A 400 naming the first field `body` sets that is refused, or set to a value that is."""
    for name, (treatment, why) in fields.items():
        value = getattr(body, name, None)
        if treatment == REFUSED and value is not None:
            raise InvalidRequest(f"{name} is not supported: {why}", param=name)
    if getattr(body, "modalities", None) and set(body.modalities) != {"text"}:
        raise InvalidRequest('modalities other than ["text"] are not supported: this server '
                             "generates text only", param="modalities")
    if getattr(body, "verbosity", None) not in (None, "medium"):
        raise InvalidRequest(f"verbosity {body.verbosity!r} is not supported: open models have "
                             'no verbosity control (send "medium" or leave it out)',
                             param="verbosity")
    _check_metadata(getattr(body, "metadata", None))


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > 16:
        raise InvalidRequest(f"metadata has {len(metadata)} pairs; the limit is 16",
                             param="metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise InvalidRequest("metadata keys may have at most 64 characters",
                                 param=f"metadata.{key[:64]}")
        if len(value) > 512:
            raise InvalidRequest("metadata values may have at most 512 characters",
                                 param=f"metadata.{key}")


def effort_update(body: Any, template: str | None) -> dict[str, Any]:
    """What a chat body's reasoning_effort changes in it, on a server with a reasoning
    parser: a thinking_budget (none/minimal: 0, and the template's thinking switch off where
    it has one). Fields the client set itself win."""
    effort = body.reasoning_effort
    if effort is None:
        return {}
    update: dict[str, Any] = {}
    budget = 0 if effort in EFFORT_OFF else EFFORT_BUDGET[effort]
    if body.thinking_budget is None and budget is not None:
        update["thinking_budget"] = budget
    if effort in EFFORT_OFF and isinstance(template, str):
        kwargs = dict(body.chat_template_kwargs or {})
        switch = next((v for v in _SWITCHES if re.search(rf"\b{v}\b", template)), None)
        if switch is not None and switch not in kwargs:
            update["chat_template_kwargs"] = {**kwargs, switch: False}
    return update
