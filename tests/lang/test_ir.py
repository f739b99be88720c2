from __future__ import annotations

import json

import pydantic
import pytest

import radixflow as rf
from radixflow.ir import (
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Seq,
    Text,
    flatten,
)
from radixflow.params import DEFAULT_PARAMS, GenParams


def test_plus_builds_a_flat_sequence():
    seq = "Q: " + rf.gen("a", max_tokens=4) + "\n" + rf.select("b", choices=["x", "y"])
    assert isinstance(seq, Seq)
    assert [type(n) for n in seq.nodes] == [Text, Gen, Text, Select]
    assert flatten(["a", ["b", rf.gen("c")]])[1] == Text("b")


def test_role_blocks_wrap_their_content():
    nodes = rf.user("hi " + rf.gen("x")).nodes
    assert nodes[0] == RoleBegin("user") and nodes[-1] == RoleEnd("user")
    assert rf.assistant().nodes == (RoleBegin("assistant"), RoleEnd("assistant"))
    assert rf.system_begin() == RoleBegin("system") and rf.user_end() == RoleEnd("user")


def test_gen_params_merge_and_wire_shape():
    node = rf.gen("a", max_tokens=7, stop="\n", temperature=0)
    params = node.params.merged(GenParams.make(max_new_tokens=99, top_p=0.5))
    assert (params.max_tokens, params.top_p, params.stop) == (7, 0.5, ("\n",))
    sp = params.to_sampling_params()
    assert sp["max_new_tokens"] == 7 and sp["stop"] == ["\n"] and sp["temperature"] == 0
    assert sp["top_k"] == -1 and "seed" not in sp
    assert rf.gen(seed=3).params.to_sampling_params()["seed"] == 3
    assert DEFAULT_PARAMS.to_sampling_params()["max_new_tokens"] == 128
    with pytest.raises(rf.InvalidRequest, match="unknown sampling option"):
        GenParams.make(max_tokenz=3)


def test_bad_regex_is_a_grammar_error_naming_the_pattern():
    with pytest.raises(rf.GrammarError, match=r"regex '\[a-' does not compile"):
        rf.gen("x", regex="[a-")


def test_empty_choices_are_rejected():
    with pytest.raises(rf.InvalidRequest, match="choices is empty"):
        rf.select("x", choices=[])
    with pytest.raises(rf.InvalidRequest, match="empty"):
        rf.gen("x", choices=[])
    with pytest.raises(rf.InvalidRequest, match="non-empty string"):
        rf.select("x", choices=["a", ""])
    with pytest.raises(rf.InvalidRequest, match="list of strings"):
        rf.select("x", choices="ab")
    with pytest.raises(rf.InvalidRequest, match="unknown select method"):
        rf.select("x", choices=["a"], method="vote")


def test_gen_with_choices_is_select_and_methods_have_aliases():
    node = rf.gen("x", choices=["a", "b"], choices_method="sum")
    assert node == Select("x", ("a", "b"), "sum")
    assert rf.select("x", ["a"], method="mean").method == "token_length_normalized"
    unconditional = rf.select("x", ["a"], method="unconditional")
    assert unconditional.method == "unconditional_likelihood_normalized"


def test_json_schema_from_pydantic_dict_or_string():
    class Person(pydantic.BaseModel):
        name: str
        age: int

    node = rf.gen("p", json_schema=Person)
    assert json.loads(node.json_schema)["properties"]["age"]["type"] == "integer"
    assert json.loads(rf.gen(json_schema={"type": "object"}).json_schema) == {"type": "object"}
    with pytest.raises(rf.GrammarError, match="not valid JSON"):
        rf.gen(json_schema="{nope")
    with pytest.raises(rf.InvalidRequest, match="at most one"):
        rf.gen(regex="a", json_schema={"type": "object"})


@pytest.mark.parametrize("kind, spec, option", [
    ("json_schema", json.dumps({"type": "object", "not": {}}), {"json_schema": {
        "type": "object", "not": {}}}),
    ("json_schema", json.dumps({"oneOf": [{"type": "integer"}, {"type": "number"}]}),
     {"json_schema": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}),
    ("regex", "a(?=b)", {"regex": "a(?=b)"}),
])
def test_a_constraint_the_server_refuses_fails_at_the_call_with_its_message(kind, spec, option):
    from radixflow.runtime.constrained import prepare

    with pytest.raises(rf.GrammarError) as server:
        prepare(kind, spec)
    with pytest.raises(rf.GrammarError) as dsl:
        rf.gen("x", **option)
    assert str(dsl.value) == str(server.value) and dsl.value.param == server.value.param


def test_dtype_becomes_regex_and_stops():
    node = rf.gen("n", dtype=int, stop=["!"])
    assert node.regex == r"[-+]?[0-9]+[ \n]*"
    assert node.params.stop == ("!", " ", "\n")
    with pytest.raises(rf.InvalidRequest, match="dtype"):
        rf.gen(dtype=list)


def test_adding_something_else_is_a_clear_error():
    with pytest.raises(rf.InvalidRequest, match="cannot add int"):
        flatten(3)
    with pytest.raises(rf.InvalidRequest, match="variable name"):
        rf.gen("")
