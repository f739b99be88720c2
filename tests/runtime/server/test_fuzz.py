"""Hundreds of generated malformed bodies: each gets a 4xx JSON error naming the problem, and
afterwards the server still serves and holds no KV for them."""

from __future__ import annotations

import json

import requests
from helpers.live_server import wait_idle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)

# Values that are wrong for the field they are put in.
NOT_INT = st.one_of(st.text(max_size=5), st.floats(allow_nan=False).filter(
    lambda x: x != int(x) if abs(x) < 1e15 else True), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.booleans())
NOT_NUMBER = st.one_of(st.text(max_size=5), st.lists(st.integers(), max_size=2), st.booleans(),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
NOT_BOOL = st.one_of(st.text(max_size=5), st.integers(), st.lists(st.booleans(), max_size=2))


def _bad_sampling() -> st.SearchStrategy:
    return st.one_of(
        st.fixed_dictionaries({"max_new_tokens": NOT_INT | st.integers(max_value=-1)
                               | st.integers(min_value=(1 << 20) + 1)}),
        st.fixed_dictionaries({"temperature": NOT_NUMBER | st.floats(min_value=100.5)
                               | st.floats(max_value=-0.01)}),
        st.fixed_dictionaries({"top_p": NOT_NUMBER | st.floats(min_value=1.01)
                               | st.floats(max_value=0.0)}),
        st.fixed_dictionaries({"top_k": NOT_INT | st.integers(max_value=-2) | st.just(0)}),
        st.fixed_dictionaries({"n": NOT_INT | st.integers(max_value=0)
                               | st.integers(min_value=129)}),
        st.fixed_dictionaries({"stop": st.integers() | st.just([""]) | st.lists(
            st.integers(), min_size=1, max_size=3)}),
        st.fixed_dictionaries({"ignore_eos": NOT_BOOL}),
        st.fixed_dictionaries({"regex": st.sampled_from(["(", "[a-", "a{2,1}", "(?<=a)b"])}),
        st.dictionaries(st.text(min_size=1, max_size=8).filter(
            lambda k: k not in _SAMPLING_KEYS), json_scalars, min_size=1, max_size=2),
        st.just("not an object"),
        st.lists(st.integers(), max_size=3),
    )


_SAMPLING_KEYS = {"max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
                  "repetition_penalty", "frequency_penalty", "presence_penalty", "stop",
                  "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim", "n",
                  "seed", "regex", "json_schema", "ebnf", "choices",
                  "spaces_between_special_tokens", "stream_interval", "custom_params",
                  "structural_tag", "logit_bias", "stop_regex", "lora_path", "sampling_seed"}

BASE_GENERATE = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}

bad_generate = st.one_of(
    # No prompt at all: always invalid, whatever else is there.
    st.dictionaries(st.sampled_from(["sampling_params", "stream", "rid", "foo", "return_logprob"]),
                    json_values, max_size=4),
    st.builds(lambda v: {**BASE_GENERATE, "text": v},
              st.just("") | st.just([]) | st.integers() | st.lists(st.integers(), min_size=1)
              | st.dictionaries(st.text(max_size=3), st.text(max_size=3), min_size=1)),
    st.builds(lambda v: {"input_ids": v, "sampling_params": {"max_new_tokens": 1}},
              st.just([]) | st.lists(st.integers(min_value=512), min_size=1, max_size=3)
              | st.lists(st.integers(max_value=-1), min_size=1, max_size=3)
              | st.lists(st.text(max_size=3), min_size=1, max_size=3) | st.just([[]])),
    st.builds(lambda sp: {"text": "Hello", "sampling_params": sp}, _bad_sampling()),
    st.builds(lambda v: {**BASE_GENERATE, "stream": v}, NOT_BOOL),
    st.builds(lambda v: {**BASE_GENERATE, "return_logprob": True, "logprob_start_len": v},
              st.integers(max_value=-2) | st.integers(min_value=50) | NOT_INT),
    st.builds(lambda v: {**BASE_GENERATE, "return_logprob": True, "top_logprobs_num": v},
              st.integers(max_value=-1) | st.integers(min_value=101) | NOT_INT),
    st.builds(lambda n: {"text": "a " * n, "sampling_params": {"max_new_tokens": 1}},
              st.integers(min_value=4200, max_value=6000)),
    json_values.filter(lambda v: not isinstance(v, dict)),
)

MESSAGES = [{"role": "user", "content": "Hi"}]
BASE_CHAT = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}

bad_chat = st.one_of(
    st.dictionaries(st.sampled_from(["messages", "max_tokens", "temperature", "foo"]),
                    json_values, max_size=4),  # no model
    st.builds(lambda v: {**BASE_CHAT, "messages": v},
              st.just([]) | json_scalars | st.lists(st.fixed_dictionaries(
                  {"role": st.text(max_size=6).filter(
                      lambda r: r not in {"system", "developer", "user", "assistant", "tool"}),
                   "content": st.text(max_size=5)}), min_size=1, max_size=2)
              | st.lists(st.fixed_dictionaries({"role": st.just("user"),
                                                "content": st.integers()}), min_size=1)),
    st.builds(lambda k, v: {**BASE_CHAT, k: v},
              st.sampled_from(["max_tokens", "max_completion_tokens", "n", "top_logprobs",
                               "seed"]), NOT_INT),
    st.builds(lambda v: {**BASE_CHAT, "max_tokens": v},
              st.integers(max_value=0) | st.integers(min_value=4100)),
    st.builds(lambda k, v: {**BASE_CHAT, k: v},
              st.sampled_from(["temperature", "top_p", "presence_penalty",
                               "frequency_penalty"]), NOT_NUMBER | st.floats(min_value=2.5)),
    st.builds(lambda v: {**BASE_CHAT, "logprobs": True, "top_logprobs": v},
              st.integers(min_value=21) | st.integers(max_value=-1)),
    st.builds(lambda v: {**BASE_CHAT, "logprobs": v}, NOT_BOOL),
    st.builds(lambda k, v: {**BASE_CHAT, k: v},
              st.text(min_size=1, max_size=10).filter(lambda k: k not in _CHAT_KEYS),
              json_scalars),
    st.builds(lambda v: {**BASE_CHAT, "response_format": v},
              st.just({"type": "json_schema"}) | st.just({"type": "xml"})
              | json_scalars.filter(lambda v: v is not None)),
    st.builds(lambda v: {**BASE_CHAT, "model": v}, st.text(max_size=8).filter(
        lambda m: m != "tiny") | st.integers()),
    st.builds(lambda v: {**BASE_CHAT, "stop": v},
              st.just([""]) | st.integers() | st.lists(st.integers(), min_size=1)),
)

_CHAT_KEYS = {"model", "messages", "max_tokens", "max_completion_tokens", "n", "stop", "seed",
              "temperature", "top_p", "frequency_penalty", "presence_penalty", "stream",
              "stream_options", "user", "logit_bias", "response_format", "top_k", "min_p",
              "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
              "skip_special_tokens", "no_stop_trim", "regex", "ebnf", "json_schema",
              "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
              "add_generation_prompt", "continue_final_message", "chat_template_kwargs"}

bad_completion = st.one_of(
    st.builds(lambda v: {"model": "tiny", "prompt": v, "max_tokens": 2},
              st.just("") | st.just([]) | st.just([[]]) | st.booleans()
              | st.lists(st.integers(min_value=512), min_size=1, max_size=2)
              | st.dictionaries(st.text(max_size=3), st.integers(), min_size=1)),
    st.builds(lambda v: {"model": "tiny", "prompt": "Hi", "logprobs": v},
              st.integers(min_value=6) | st.integers(max_value=-1) | NOT_INT),
    st.builds(lambda v: {"model": "tiny", "prompt": "Hi", "max_tokens": v},
              st.integers(max_value=-1) | st.integers(min_value=4100) | NOT_INT),
    st.builds(lambda v: {"model": "tiny", "prompt": "Hi", "echo": True, "stream": True,
                         "max_tokens": v}, st.integers(1, 3)),
)


def check_rejected(server, path: str, body) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = requests.post(server.url + path, data=data, timeout=60,
                      headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, body, r.text[:300])
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"], body


@FUZZ
@given(body=bad_generate)
def test_generate_rejects(server, body):
    check_rejected(server, "/generate", body)


@FUZZ
@given(body=bad_chat)
def test_chat_rejects(server, body):
    check_rejected(server, "/v1/chat/completions", body)


def _parses_as_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


@FUZZ
@given(body=bad_completion | st.binary(max_size=30).filter(lambda b: not _parses_as_object(b)))
def test_completions_reject(server, body):
    check_rejected(server, "/v1/completions", body)


def test_still_serving_and_no_leak_after_fuzz(server, client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    assert r.choices[0].message.content is not None
    info = wait_idle(server)
    assert info["healthy"] and info["failure"] is None
