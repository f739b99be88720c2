"""GenParams: the DSL's sampling options derive from SamplingParams (names, defaults, checks),
and the OpenAI backend's request fields from the OpenAI request models' names."""

from __future__ import annotations

import pytest

import radixflow as rf
from radixflow.backends.openai import openai_sampling
from radixflow.params import DEFAULT_PARAMS, FIELDS, SAMPLING_NAMES, GenParams, sampling_name
from radixflow.runtime.sampling_params import OPTIONS, SamplingParams


def test_every_option_is_a_sampling_params_option_with_its_default():
    defaults = SamplingParams()
    for name in FIELDS:
        assert sampling_name(name) in OPTIONS, name
        value = getattr(DEFAULT_PARAMS, name)
        expected = getattr(defaults, sampling_name(name))
        assert (list(value) if isinstance(value, tuple) else value) == expected, name


def test_the_wire_dict_is_every_option_by_its_sampling_params_name():
    sp = rf.gen(max_tokens=3, min_tokens=1, stop="!", stop_token_ids=[4]).params \
        .to_sampling_params()
    assert sp["max_new_tokens"] == 3 and sp["min_new_tokens"] == 1
    assert sp["stop"] == ["!"] and sp["stop_token_ids"] == [4]
    assert not set(SAMPLING_NAMES) & set(sp)
    assert SamplingParams.from_dict(sp).max_new_tokens == 3  # the server takes it as it is


def test_make_takes_sampling_params_names_as_aliases():
    assert GenParams.make(max_new_tokens=5, min_new_tokens=2) == GenParams(max_tokens=5,
                                                                          min_tokens=2)
    assert GenParams.make(stop_regex="a+", stop=["x", "y"]).stop_regex == ("a+",)
    with pytest.raises(rf.InvalidRequest, match="unknown sampling option"):
        GenParams.make(logit_bias={1: 2})  # an option the DSL does not expose


def test_gen_refuses_an_unknown_keyword_as_python_does():
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_new_tokens'"):
        rf.gen("x", max_new_tokens=3)
    with pytest.raises(rf.InvalidRequest, match="thinking_budget must be between 0"):
        rf.gen("x", thinking_budget=-1)
    with pytest.raises(rf.InvalidRequest, match="n must be int"):
        rf.gen("x", n=True)


def test_openai_fields_come_from_the_openai_names_and_skip_defaults():
    sp = rf.gen(max_tokens=5, min_tokens=2, temperature=0, top_k=4, stop=".").params \
        .to_sampling_params()
    assert openai_sampling({**sp, "n": 2, "thinking_budget": 9}) == {
        "max_tokens": 5, "min_tokens": 2, "temperature": 0, "top_k": 4, "stop": ["."], "n": 2,
        "thinking_budget": 9}
    assert openai_sampling(DEFAULT_PARAMS.to_sampling_params()) == {"max_tokens": 128}
    with pytest.raises(rf.UnsupportedFeature, match="stop_regex is not an OpenAI API field"):
        openai_sampling({"stop_regex": ["a"]})
