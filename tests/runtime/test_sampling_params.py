from __future__ import annotations

import pytest

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.sampling_params import SamplingParams


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
