"""The OpenAI requests' sampling options: names mapped to SamplingParams' (sampling_field /
sampling_names), bounds taken from the options, and what a body asks for (no server)."""

from __future__ import annotations

import annotated_types
import pytest

from radixflow.runtime.sampling_params import MAX_NEW_TOKENS_LIMIT, OPTIONS
from radixflow.runtime.server.openai_protocol import (
    INT64_MAX,
    ChatCompletionRequest,
    CompletionRequest,
    sampling_names,
)
from radixflow.runtime.server.openai_requests import requested_sampling

MESSAGES = [{"role": "user", "content": "hi"}]
# Where the OpenAI surface allows less than SamplingParams (field -> its own bounds).
NARROWER = {"temperature": {"le": 2.0}, "seed": {"ge": -INT64_MAX - 1, "le": INT64_MAX},
            "min_tokens": {"le": MAX_NEW_TOKENS_LIMIT}}
CHAT_NARROWER = {"max_tokens": {"ge": 1}, "max_completion_tokens": {"ge": 1}}


def bounds_of(model, name: str) -> dict:
    out = {}
    for item in model.model_fields[name].metadata:
        for key in ("ge", "gt", "le", "lt"):
            if isinstance(item, getattr(annotated_types, key.capitalize())):
                out[key] = getattr(item, key)
    return out


def test_names_map_to_options():
    chat = sampling_names(ChatCompletionRequest)
    assert chat["max_tokens"] == chat["max_completion_tokens"] == "max_new_tokens"
    assert chat["min_tokens"] == "min_new_tokens" and chat["thinking_budget"] == "thinking_budget"
    assert "thinking_budget" not in sampling_names(CompletionRequest)
    assert set(chat.values()) <= set(OPTIONS)
    assert {"temperature", "top_p", "stop", "seed", "logit_bias", "n"} <= set(chat)


@pytest.mark.parametrize(("model", "narrower"), [
    (CompletionRequest, NARROWER), (ChatCompletionRequest, {**NARROWER, **CHAT_NARROWER})])
def test_bounds_are_the_options_unless_narrowed(model, narrower):
    for name, option in sampling_names(model).items():
        rule = OPTIONS[option].rule
        expected = {**(rule.schema_bounds() if rule else {}), **narrower.get(name, {})}
        assert bounds_of(model, name) == expected, name


def test_a_body_asks_for_what_it_sets_by_sampling_params_names():
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": MESSAGES, "max_tokens": 5, "temperature": 0, "stop": "x",
         "min_tokens": 2, "seed": 3})
    requested = requested_sampling(chat)
    assert requested["max_new_tokens"] == 5 and requested["min_new_tokens"] == 2
    assert requested["temperature"] == 0 and requested["stop"] == "x" and requested["seed"] == 3
    assert "top_p" not in requested and "thinking_budget" not in requested  # null: default


def test_max_completion_tokens_wins_and_no_max_tokens_means_none_asked():
    both = {"model": "m", "messages": MESSAGES, "max_tokens": 5, "max_completion_tokens": 7}
    assert requested_sampling(
        ChatCompletionRequest.model_validate(both))["max_new_tokens"] == 7
    neither = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES})
    assert "max_new_tokens" not in requested_sampling(neither)
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "a"})
    assert requested_sampling(completion)["max_new_tokens"] == 16  # OpenAI's default
