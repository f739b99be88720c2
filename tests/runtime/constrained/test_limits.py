"""Validation: bad or unsupported constraints and grammar bombs are a GrammarError (400) that
says which and why; nothing reaches the compiler."""

from __future__ import annotations

import json

import pytest

from radixflow.runtime.constrained import GrammarLimits, validate_constraint
from radixflow.runtime.errors import GrammarError, InvalidRequest


def _reject(kind: str, spec, *fragments: str) -> GrammarError:
    with pytest.raises(GrammarError) as info:
        validate_constraint(kind, spec)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert info.value.status_code == 400
    return info.value


@pytest.mark.parametrize("pattern,why", [
    ("(abc", "invalid regex"),
    ("[z-a]", "invalid regex"),
    (r"(a)\1", "Group references"),
    (r"\bword", "not implemented"),
    ("a(?=b)", "lookahead"),
    ("(?<=a)b", "lookbehind"),
    ("(?i)abc", "inline flags"),
    (r"\p{L}+", "unicode properties"),
    ("a^b", "'^'"),
    ("", "empty"),
])
def test_bad_regex_says_why(pattern, why):
    error = _reject("regex", pattern, why)
    assert error.param == "regex"


@pytest.mark.parametrize("pattern", [
    r"^\d{4}-\d{2}-\d{2}$", r"(?P<year>\d{4})", r"[^\n]{1,100}", r"(a|b)*?c", r"(?:ab)+",
    r"[]x]", r"\$\d+",
])
def test_good_regex_passes(pattern):
    validate_constraint("regex", pattern)


@pytest.mark.parametrize("pattern,limit", [
    ("a{5000}", "repeats up to 5000 times"),
    ("[a-z]{1,1001}", "repeats up to 1001 times"),
    ("(([a-z]{1,100}){1,100}){1,10}", "nests bounded repetitions"),
    ("x" * 5000, "characters long"),
])
def test_regex_bombs(pattern, limit):
    _reject("regex", pattern, limit)


def test_limits_are_configurable():
    loose = GrammarLimits()
    validate_constraint("regex", "a{900}", loose)
    from radixflow.runtime.constrained import RegexLimits

    with pytest.raises(GrammarError, match="limit is 100"):
        validate_constraint("regex", "a{900}", GrammarLimits(regex=RegexLimits(max_repeat=100)))


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("schema,why", [
    ("{not json", "not valid JSON"),
    ('"a string"', "must be an object or a boolean"),
    (json.dumps(_nested(40)), "nests deeper than 32"),
    (json.dumps({"type": "object",
                 "properties": {f"p{i}": {"type": "string"} for i in range(3000)}}),
     "characters long"),
    (json.dumps({"anyOf": [{"type": "integer"}] * 2500}), "more than 2000 subschemas"),
    (json.dumps({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (json.dumps({"not": {"type": "string"}}), "negation"),
    (json.dumps({"if": {"type": "integer"}, "then": {"minimum": 1}}), "if/then/else"),
    (json.dumps({"type": "object", "dependentRequired": {"a": ["b"]}}), "dependentRequired"),
    (json.dumps({"allOf": [{"type": "integer"}, {"minimum": 2}]}), "allOf"),
    (json.dumps({"type": "number", "multipleOf": 0.5}), "multipleOf"),
    (json.dumps({"type": "integer", "multipleOf": 5, "minimum": 0}), "one-sided"),
    (json.dumps({"type": "integer", "multipleOf": 4096}), "1..1024"),
    (json.dumps({"type": "string", "pattern": "a+", "maxLength": 4}), "minLength/maxLength"),
    (json.dumps({"type": "string", "format": "email", "minLength": 4}), "minLength/maxLength"),
    (json.dumps({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}),
     "contains"),
    (json.dumps({"$ref": "https://example.com/schema.json"}), "only local references"),
    (json.dumps({"type": "string", "pattern": "(a"}), "pattern at #"),
    (json.dumps({"type": "string", "pattern": "a{9999}"}), "repeats up to 9999"),
    (json.dumps({"type": "object", "patternProperties": {"(?=x)": {}}}), "lookahead"),
])
def test_bad_schema_says_why(schema, why):
    error = _reject("json_schema", schema, why)
    assert error.param == "json_schema"


def test_keywords_as_property_names_are_fine():
    schema = {"type": "object", "properties": {"not": {"type": "string"},
                                               "if": {"type": "boolean"}}}
    validate_constraint("json_schema", json.dumps(schema))


def test_single_allof_and_annotations_pass():
    schema = {"allOf": [{"type": "integer"}], "description": "wrapped", "title": "T"}
    validate_constraint("json_schema", json.dumps(schema))


@pytest.mark.parametrize("spec,why", [
    ("[]", "non-empty list"),
    ('["a", ""]', "non-empty list"),
    ('["a", 3]', "non-empty list"),
    ("not json", "non-empty list"),
    (json.dumps([f"c{i}" for i in range(2000)]), "limit is 1024"),
    (json.dumps(["x" * 40_000, "y" * 40_000]), "characters"),
])
def test_bad_choices(spec, why):
    _reject("choices", spec, why)


def test_ebnf_and_kind_checks():
    _reject("ebnf", "   ", "non-empty")
    _reject("ebnf", "root ::= " + '"a" | ' * 20_000 + '"b"', "characters long")
    _reject("yaml", "a: 1", "unknown constraint kind")
    validate_constraint("json_object", "")


def test_grammar_error_is_an_invalid_request():
    with pytest.raises(InvalidRequest):
        validate_constraint("regex", "(")
