"""stop_regex, logit_bias, stream_interval and spaces_between_special_tokens as parsed from a
/generate body, the SGLang fields radixflow refuses rather than ignores, and the ranges options
are checked against (no model)."""

from __future__ import annotations

import pytest
from helpers.tiny_models import make_tiny_tokenizer

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.messages import GenerateReq, decode, encode
from radixflow.runtime.native_api import parse_generate
from radixflow.runtime.native_fields import UNSUPPORTED_FIELDS
from radixflow.runtime.sampling_options import at_least, between, interval
from radixflow.runtime.sampling_params import (
    MAX_LOGIT_BIAS,
    MAX_STOP_REGEX_LEN,
    MAX_STOP_REGEXES,
    OPTIONS,
    SamplingParams,
)


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def test_stop_regex_takes_a_string_or_a_list():
    assert SamplingParams.from_dict({"stop_regex": r"\d+\."}).stop_regex == [r"\d+\."]
    assert SamplingParams.from_dict({"stop_regex": ["a+b", "c"]}).stop_regex == ["a+b", "c"]
    assert SamplingParams.from_dict({"stop_regex": None}).stop_regex == []


def test_logit_bias_keys_may_be_strings_as_openai_sends_them():
    params = SamplingParams.from_dict({"logit_bias": {"17": 5, 3: -100, "0": 0.5}})
    assert params.logit_bias == {17: 5.0, 3: -100.0, 0: 0.5}
    assert all(isinstance(v, float) for v in params.logit_bias.values())


def test_new_fields_cross_the_wire():
    params = SamplingParams.from_dict({"logit_bias": {"5": -100, 7: 2.5}, "stop_regex": "a+b",
                                       "stream_interval": 3,
                                       "spaces_between_special_tokens": False})
    msg = GenerateReq(rid="r", input_ids=[1], sampling=params)
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize(("bad", "param"), [
    ({"stop_regex": "(unclosed"}, "stop_regex"),
    ({"stop_regex": ["ok", "[a-"]}, "stop_regex"),
    ({"stop_regex": "a*"}, "stop_regex"),  # matches the empty string: would stop at once
    ({"stop_regex": [1]}, "stop_regex"),
    ({"stop_regex": ["x"] * (MAX_STOP_REGEXES + 1)}, "stop_regex"),
    ({"stop_regex": "x" * (MAX_STOP_REGEX_LEN + 1)}, "stop_regex"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {"1": 100.5}}, "logit_bias"),
    ({"logit_bias": {"1": -101}}, "logit_bias"),
    ({"logit_bias": {"1": "high"}}, "logit_bias"),
    ({"logit_bias": {"1": True}}, "logit_bias"),
    ({"logit_bias": {"1": float("nan")}}, "logit_bias"),
    ({"logit_bias": {"1": 1, "01": 2}}, "logit_bias"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}}, "logit_bias"),
    ({"stream_interval": 0}, "stream_interval"),
    ({"stream_interval": 1.5}, "stream_interval"),
    ({"spaces_between_special_tokens": "no"}, "spaces_between_special_tokens"),
    ({"custom_params": {"k": 1}}, "custom_params"),
    ({"lora_path": "adapter"}, "lora_path"),
])
def test_bad_values_are_refused_naming_the_field(bad, param):
    with pytest.raises(InvalidRequest) as info:
        SamplingParams.from_dict(bad)
    assert info.value.param == param


def test_unsupported_sampling_keys_say_so():
    for key in ("custom_params", "lora_path"):
        with pytest.raises(InvalidRequest, match="not supported"):
            SamplingParams.from_dict({key: "x"})
        SamplingParams.from_dict({key: None})  # null: nothing asked


def test_logit_bias_ids_must_be_in_the_vocabulary(tok):
    vocab = len(tok)
    ok = {"text": "a", "sampling_params": {"logit_bias": {str(vocab - 1): 1}}}
    assert parse_generate(ok, tok, 64).reqs[0].sampling.logit_bias == {vocab - 1: 1.0}
    body = {"text": "a", "sampling_params": {"logit_bias": {"3": 1, str(vocab): 1}}}
    with pytest.raises(InvalidRequest) as info:
        parse_generate(body, tok, 64)
    assert info.value.param == "logit_bias" and str(vocab) in info.value.message


@pytest.mark.parametrize("field", UNSUPPORTED_FIELDS)
def test_unsupported_top_level_fields_are_refused(tok, field):
    value = True if field == "return_hidden_states" else [1] if field == "token_ids_logprob" \
        else "x"
    with pytest.raises(InvalidRequest, match="not supported") as info:
        parse_generate({"text": "a", field: value}, tok, 64)
    assert info.value.param == field
    for unset in (None, False):  # left at SGLang's default: fine
        parse_generate({"text": "a", field: unset}, tok, 64)


def test_lora_path_inside_sampling_params_is_refused_too(tok):
    with pytest.raises(InvalidRequest, match="lora_path is not supported"):
        parse_generate({"text": "a", "sampling_params": {"lora_path": "x"}}, tok, 64)


@pytest.mark.parametrize(("text", "bounds", "inside", "outside"), [
    ("[0, 100]", {"ge": 0, "le": 100}, [0, 100], [-0.01, 100.5]),
    ("(0, 1]", {"gt": 0, "le": 1}, [1, 1e-9], [0, 1.01]),
    ("[-2, 2]", {"ge": -2, "le": 2}, [-2, 2], [-2.5, 3]),
])
def test_interval(text, bounds, inside, outside):
    rule = interval(text)
    assert rule.why == f"must be in {text}" and rule.schema_bounds() == bounds
    assert all(rule.holds(x) for x in inside) and not any(rule.holds(x) for x in outside)


def test_a_range_with_single_values_states_its_hull():
    top_k = OPTIONS["top_k"].rule
    assert top_k.schema_bounds() == {"ge": -1}
    assert top_k.holds(-1) and top_k.holds(1) and not top_k.holds(0)
    assert between(2, 64).schema_bounds() == {"ge": 2, "le": 64}
    assert at_least(1).schema_bounds() == {"ge": 1}
