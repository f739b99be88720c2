"""The constraint front door: `prepare` parses, rewrites and checks a constraint once and
returns the frozen, normalised Constraint the scheduler compiles as it is."""

from __future__ import annotations

import json

import msgspec
import pytest

from radixflow.runtime.constrained import (
    Constraint,
    clear_prepared,
    front_door,
    prepare,
    schema_check,
)
from radixflow.runtime.constrained.xgrammar_compat import FORMAT_PATTERNS
from radixflow.runtime.errors import GrammarError

ARGS = {"type": "object", "properties": {"day": {"type": "string", "format": "date"}},
        "required": ["day"], "additionalProperties": False}


@pytest.fixture
def counted(monkeypatch):
    """How often a schema was parsed and rewritten since the test began (nothing cached)."""
    clear_prepared()
    counts = {"parse": 0, "rewrite": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(front_door, "parse_json_schema",
                        counting("parse", front_door.parse_json_schema))
    monkeypatch.setattr(schema_check, "rewrite_schema",
                        counting("rewrite", schema_check.rewrite_schema))
    return counts


def test_each_kind_is_normalised_to_what_xgrammar_compiles():
    assert prepare("regex", r"^(?P<y>\d{4}).$").spec == r"(\d{4})[^\n]"
    schema = json.loads(prepare("json_schema", json.dumps(ARGS)).spec)
    assert schema["properties"]["day"] == {"type": "string", "pattern": FORMAT_PATTERNS["date"]}
    assert prepare("choices", json.dumps(["a", "é"])).spec == 'root ::= "a" | "é"'
    assert prepare("json_object", "").spec == '{"type": "object"}'
    assert prepare("ebnf", 'root ::= "x"').spec == 'root ::= "x"'
    legacy = {"structures": [{"begin": "<f>", "schema": ARGS, "end": "</f>"}],
              "triggers": ["<f>"]}
    tag = json.loads(prepare("structural_tag", json.dumps(legacy)).spec)
    assert tag["format"]["type"] == "triggered_tags"
    assert tag["format"]["tags"][0]["content"]["json_schema"] == schema


def test_a_constraint_is_frozen_keyed_and_travels_as_msgpack():
    first = prepare("regex", "[a-z]+")
    same = prepare("regex", "^[a-z]+$")  # the same normalised spec: equal, one cache entry
    assert same.key == first.key and same == first and {first: 1}[same] == 1
    assert prepare("regex", "[a-y]+").key != first.key
    assert prepare("ebnf", 'root ::= "a"').key != prepare("choices", '["a"]').key
    with pytest.raises(AttributeError):
        first.spec = "x"
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(first), type=Constraint) == first


def test_a_schema_is_parsed_and_rewritten_once(counted):
    spec = json.dumps({**ARGS, "title": "once"})
    for _ in range(3):
        prepare("json_schema", spec)
    assert counted == {"parse": 1, "rewrite": 1}


def test_a_structural_tag_finds_its_schemas_prepared(counted):
    """The tool-call path: each tool's parameters are prepared when the tools are checked; the
    structural tag holding the calls to them parses none of them again."""
    tools = [{**ARGS, "title": f"tool {i}"} for i in range(3)]
    for schema in tools:
        prepare("json_schema", json.dumps(schema))
    tag = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<"],
           "tags": [{"type": "tag", "begin": f"<{i}>", "end": "</>",
                     "content": {"type": "json_schema", "json_schema": schema}}
                    for i, schema in enumerate(tools)]}}
    prepare("structural_tag", json.dumps(tag, ensure_ascii=False))
    assert counted == {"parse": 3, "rewrite": 3}


def test_refusals_keep_their_message_and_field():
    with pytest.raises(GrammarError, match="negation") as info:
        prepare("json_schema", json.dumps({"not": {}}))
    assert info.value.param == "json_schema" and info.value.status_code == 400
    bad_tag = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<a>", "end": "</a>",
        "content": {"type": "json_schema", "json_schema": {"if": {}}}}}
    with pytest.raises(GrammarError, match="if/then/else") as info:
        prepare("structural_tag", json.dumps(bad_tag))
    assert info.value.param == "json_schema"
    with pytest.raises(GrammarError, match="unknown constraint kind 'grammar'"):
        prepare("grammar", "x")


def test_the_cache_is_bounded_in_bytes(monkeypatch):
    clear_prepared()
    monkeypatch.setattr(front_door, "PREPARED_CACHE_BYTES", 10_000)
    for i in range(20):
        prepare("ebnf", f'root ::= "{i}"' + " " * 1000)
    assert sum(front_door._sizes.values()) <= 10_000
    assert len(front_door._prepared) < 20
    clear_prepared()


def test_the_backend_compiles_a_prepared_constraint_without_a_second_look(backend, counted,
                                                                          monkeypatch):
    constraint = prepare("json_schema", json.dumps({**ARGS, "title": "compiled as is"}))
    monkeypatch.setattr(front_door, "prepare_uncached", None)  # any check would fail
    monkeypatch.setattr(backend, "validate", None)
    state = backend.new_state(backend.submit_prepared(constraint).result())
    assert state.matcher.accept_string('{"day": "2024-02-29"}') and state.can_terminate()
    assert not backend.new_state(backend.submit_prepared(constraint).result()) \
        .matcher.accept_string('{"day": "2023-02-29"}')
    assert counted == {"parse": 1, "rewrite": 1}


WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "when": {"type": "string", "format": "date"}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}


@pytest.mark.parametrize("parser_name", ["hermes", "llama3", "mistral", "pythonic",
                                         "qwen3_coder"])
def test_a_tool_call_request_parses_each_tool_schema_once(counted, parser_name):
    from radixflow.runtime.server.openai_tools import plan_tools
    from radixflow.runtime.server.tool_parsers import get_parser

    tools = [{"type": "function", "function": {"name": name, "parameters": {
        **schema, "title": f"{name} for {parser_name}"}}}
        for name, schema in (("get_weather", WEATHER), ("get_time", TIME))]
    plan = plan_tools(tools, "auto", None, get_parser(parser_name))  # checks the schemas
    (kind, spec), = plan.sampling_fields().items()
    prepare(kind, spec)  # what the route does with the sampling fields
    assert counted == {"parse": 2, "rewrite": 2}


def test_a_request_through_the_engine_parses_its_schema_once(tmp_path, counted, monkeypatch):
    """HTTP side and scheduler in one process, one cache: the scheduler compiles the
    prepared constraint and checks nothing."""
    from helpers.tiny_models import make_tiny_model

    from radixflow.runtime.engine import Engine

    schema = {**ARGS, "title": "through the engine"}
    tiny_llama = make_tiny_model(tmp_path / "tiny-llama", "llama")
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=2000) as engine:
        backend = engine.scheduler.grammars.backend
        compiled_keys = []
        compile_fn = backend._cache._compile_fn

        def recording(key):
            compiled_keys.append(key)
            return compile_fn(key)

        monkeypatch.setattr(backend._cache, "_compile_fn", recording)
        monkeypatch.setattr(backend, "validate", None)  # a check would fail the request
        out = engine.generate("Today:", {"json_schema": json.dumps(schema),
                                         "max_new_tokens": 32, "temperature": 0})
    assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert counted == {"parse": 1, "rewrite": 1}
    assert compiled_keys == [prepare("json_schema", json.dumps(schema))]
