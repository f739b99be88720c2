from __future__ import annotations

import dataclasses

import pytest

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.messages import GenerateReq, decode, encode
from radixflow.runtime.sampling_params import OPTIONS, SamplingParams, check_option


def test_sglang_frontend_record_is_accepted():
    record = {"skip_special_tokens": True, "spaces_between_special_tokens": True,
              "max_new_tokens": 128, "min_new_tokens": 0, "n": 1, "stop": "\n",
              "stop_token_ids": [], "stop_regex": [], "temperature": 0, "top_p": 1.0,
              "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
              "ignore_eos": False, "regex": None, "json_schema": None}
    params = SamplingParams.from_dict(record)
    assert params.stop == ["\n"] and params.is_greedy and params.temperature == 0.0


def test_sampling_seed_alias_and_json_schema_object():
    params = SamplingParams.from_dict({"sampling_seed": 7, "json_schema": {"type": "object"}})
    assert params.seed == 7
    assert params.json_schema == '{"type": "object"}'


@pytest.mark.parametrize("bad", [
    {"max_new_tokens": True}, {"temperature": "hot"}, {"top_p": 1.5}, {"min_p": -0.1},
    {"repetition_penalty": 0}, {"presence_penalty": 3}, {"stop": [""]}, {"stop_token_ids": [-1]},
    {"regex": "a", "choices": ["a"]}, {"choices": []}, {"seed": 1.5}, {"mystery": 1},
])
def test_bad_values_name_the_field(bad):
    with pytest.raises(InvalidRequest) as err:
        SamplingParams.from_dict(bad)
    assert any(key in str(err.value) for key in bad)


def test_every_field_is_an_option_with_its_default():
    fields = dataclasses.fields(SamplingParams)
    assert list(OPTIONS) == [f.name for f in fields]
    defaults = SamplingParams()
    for f in fields:
        assert OPTIONS[f.name].nullable == (getattr(defaults, f.name) is None), f.name
    assert SamplingParams().stop is not SamplingParams().stop  # a fresh list each time


def test_messages_name_the_field_and_the_allowed_values():
    cases = {
        "max_new_tokens": (-1, f"max_new_tokens must be between 0 and {1 << 20} (got -1)"),
        "temperature": (101, "temperature must be in [0, 100] (got 101.0)"),
        "top_p": (0, "top_p must be in (0, 1] (got 0.0)"),
        "top_k": (0, "top_k must be -1 (disabled) or >= 1 (got 0)"),
        "n": (129, "n must be in [1, 128] (got 129)"),
        "ignore_eos": (1, "ignore_eos must be bool (got 1)"),
        "min_p": ("x", "min_p must be int/float (got 'x')"),
        "regex": (3, "regex must be a string (got 3)"),
        "stream_interval": (0, "stream_interval must be >= 1 (got 0)"),
        "max_repeat_run": (1, "max_repeat_run must be between 2 and 64 (got 1)"),
        "stop": ([""], "stop must not contain empty strings (got [''])"),
    }
    for name, (value, message) in cases.items():
        with pytest.raises(InvalidRequest) as err:
            SamplingParams.from_dict({name: value})
        assert (err.value.param, err.value.message) == (name, message)


def test_types_are_checked_before_values():
    with pytest.raises(InvalidRequest) as err:
        SamplingParams.from_dict({"max_new_tokens": -1, "temperature": "hot"})
    assert err.value.param == "temperature"


def test_checks_normalise_what_passes():
    params = SamplingParams.from_dict({"temperature": 1, "top_p": 1, "logit_bias": {"3": 2}})
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert isinstance(params.top_p, float) and params.logit_bias == {3: 2.0}
    assert check_option("n", 3) == 3 and check_option("seed", None) is None
    assert check_option("min_p", 0) == 0.0
    with pytest.raises(InvalidRequest, match=r"n must be in \[1, 128\]"):
        check_option("n", 0)


def test_every_option_crosses_the_wire():
    params = SamplingParams(
        max_new_tokens=9, min_new_tokens=1, temperature=0.5, top_p=0.9, top_k=5, min_p=0.1,
        repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=-0.3, stop=["x"],
        stop_regex=["a+b"], stop_token_ids=[7], ignore_eos=True, skip_special_tokens=False,
        spaces_between_special_tokens=False, no_stop_trim=True, stream_interval=2,
        logit_bias={5: -100.0}, n=2, seed=11, thinking_budget=4, json_schema='{"type": "object"}',
        budget_safe=False, max_repeat_run=8)
    params.validate()
    assert [f.name for f in dataclasses.fields(params)
            if getattr(params, f.name) == getattr(SamplingParams(), f.name)] == [
        "regex", "ebnf", "choices", "structural_tag"]  # every other option is set
    msg = GenerateReq(rid="r", input_ids=[1, 2], sampling=params)
    back = decode(encode(msg))
    assert back == msg and back.sampling.logit_bias == {5: -100.0}
