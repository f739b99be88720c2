"""Structural tags (free text with schema-constrained tagged sections, as used for tool calls):
validation, SGLang's legacy shape, and what the compiled grammar accepts."""

from __future__ import annotations

import json

import pytest

from radixflow.runtime.constrained import validate_constraint
from radixflow.runtime.constrained.limits import GrammarLimits
from radixflow.runtime.constrained.structural_tag import parse_structural_tag
from radixflow.runtime.errors import GrammarError, InvalidRequest
from radixflow.runtime.sampling_params import SamplingParams

ARGS = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
        "additionalProperties": False}
TAG = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<call>"],
    "tags": [{"type": "tag", "begin": "<call>f ", "end": "</call>",
              "content": {"type": "json_schema", "json_schema": ARGS}}]}}
LEGACY = {"type": "structural_tag", "triggers": ["<call>"],
          "structures": [{"begin": "<call>f ", "schema": ARGS, "end": "</call>"}]}


@pytest.mark.parametrize("spec, match", [
    ("{oops", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"type": "structural_tag"}', "format"),
    (json.dumps({"structures": [{"begin": "<a>"}], "triggers": []}), "structures"),
    (json.dumps({**TAG, "format": {**TAG["format"], "tags": [
        {**TAG["format"]["tags"][0], "content": {"type": "json_schema",
                                                 "json_schema": {"not": {}}}}]}}), "negation"),
])
def test_bad_structural_tags_are_grammar_errors(spec, match):
    with pytest.raises(GrammarError, match=match):
        validate_constraint("structural_tag", spec)


def test_deep_nesting_is_refused():
    node: dict = {"type": "const_string", "value": "x"}
    for _ in range(40):
        node = {"type": "sequence", "elements": [node]}
    with pytest.raises(GrammarError, match="deeper"):
        validate_constraint("structural_tag", json.dumps({"type": "structural_tag",
                                                          "format": node}))


def test_legacy_shape_becomes_triggered_tags():
    assert parse_structural_tag(json.dumps(LEGACY), GrammarLimits()) == TAG


@pytest.mark.parametrize("tag", [TAG, LEGACY])
def test_free_text_then_a_constrained_tag(backend, tag):
    compiled = backend.compile("structural_tag", json.dumps(tag))
    state = backend.new_state(compiled)
    assert state.matcher.accept_string('Let me call it. <call>f {"x": 12}</call> Done.')
    assert state.can_terminate()
    state = backend.new_state(compiled)
    assert state.matcher.accept_string("<call>f ")
    assert not state.matcher.accept_string('{"y": 1}')  # inside the tag, the schema rules


def test_sampling_params_take_a_structural_tag():
    params = SamplingParams.from_dict({"structural_tag": TAG})
    assert params.constraint == ("structural_tag", json.dumps(TAG))
    with pytest.raises(InvalidRequest, match="at most one constraint"):
        SamplingParams.from_dict({"structural_tag": TAG, "regex": "a"})
