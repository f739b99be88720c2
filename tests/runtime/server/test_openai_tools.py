"""Structured outputs over the OpenAI API: response_format, tools / tool_choice (calls made by
constrained decoding), and bad constraints as 400s. Unit tests of openai_tools first, then the
official openai client against the live tiny-model server."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.server.openai_tools import CALL_BEGIN, CALL_END, plan_tools, with_tools

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


# ---- openai_tools, no server ----

@pytest.mark.parametrize("tools, choice, match", [
    (None, "required", "needs tools"),
    ([{"type": "retrieval"}], "auto", "tools.0"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "name"),
    (TOOLS + TOOLS[:1], "auto", "unique"),
    (TOOLS, "sometimes", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not in tools"),
])
def test_bad_tools_are_400s(tools, choice, match):
    with pytest.raises(InvalidRequest, match=match):
        plan_tools(tools, choice)


def test_no_plan_without_tools_or_with_none():
    assert plan_tools(None, None) is None
    assert plan_tools(TOOLS, "none") is None


def test_auto_constraint_allows_text_or_a_valid_call(tokenizer):
    from radixflow.runtime.constrained import GrammarBackend

    plan = plan_tools(TOOLS, None)
    assert plan.mode == "auto"
    (kind, spec), = plan.sampling_fields().items()
    backend = GrammarBackend(tokenizer, len(tokenizer))
    try:
        compiled = backend.compile(kind, spec)
        text = (f'Sure. {CALL_BEGIN}\n{{"name": "get_time", "arguments": {{"zone": "CET"}}}}\n'
                f"{CALL_END}")
        state = backend.new_state(compiled)
        assert state.matcher.accept_string(text) and state.can_terminate()
        state = backend.new_state(compiled)
        assert state.matcher.accept_string("Just text, no call.") and state.can_terminate()
        state = backend.new_state(compiled)
        assert not state.matcher.accept_string(f'{CALL_BEGIN}\n{{"name": "rm_rf"')
    finally:
        backend.shutdown()


def test_replies_are_parsed_into_tool_calls():
    auto = plan_tools(TOOLS, "auto")
    text = (f'Let me look. {CALL_BEGIN}\n{{"name": "get_weather", "arguments": '
            f'{{"city": "Oslo", "unit": "C"}}}}\n{CALL_END}')
    message, finish = auto.message(text, "stop")
    assert finish == "tool_calls" and message["content"] == "Let me look."
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather",
                                "arguments": '{"city": "Oslo", "unit": "C"}'}
    assert auto.message("No call here.", "stop") == (
        {"role": "assistant", "content": "No call here."}, "stop")
    # required and named calls are written in the format too (Hermes: in <tool_call> tags)
    required = plan_tools(TOOLS, "required")
    message, finish = required.message(
        f'{CALL_BEGIN}\n{{"name": "get_time", "arguments": {{"zone": "UTC"}}}}\n{CALL_END}',
        "stop")
    assert finish == "tool_calls" and message["content"] is None
    cut, finish = required.message(f'{CALL_BEGIN}\n{{"name": "get_ti', "length")
    assert finish == "length" and "tool_calls" not in cut
    assert cut["content"] == f'{CALL_BEGIN}{{"name": "get_ti'  # not a call: text
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    message, _ = named.message(
        f'{CALL_BEGIN}\n{{"name": "get_time", "arguments": {{"zone": "UTC"}}}}\n{CALL_END}',
        "stop")
    assert message["tool_calls"][0]["function"] == {"name": "get_time",
                                                    "arguments": '{"zone": "UTC"}'}


def test_history_and_tools_reach_the_prompt(tokenizer):
    from radixflow.runtime.server.openai_protocol import ChatMessage

    history = [ChatMessage(role="user", content="Time?"),
               ChatMessage(role="assistant", content=None, tool_calls=[{
                   "id": "call_1", "type": "function",
                   "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]),
               ChatMessage(role="tool", content="12:00", tool_call_id="call_1")]
    messages = [{"role": m.role, "content": m.text()} for m in history]
    out, extra = with_tools(tokenizer, messages, history, plan_tools(TOOLS, "auto"))
    assert extra == {}  # the tiny template knows nothing of tools: a system message says it
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"]
    assert out[2]["content"] == (f'{CALL_BEGIN}\n{{"name": "get_time", "arguments": '
                                 f'{{"zone": "UTC"}}}}\n{CALL_END}')
    assert out[3] == {"role": "tool", "content": "12:00"}


# ---- live server ----

def test_response_format_json_object(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48,
                                       temperature=0, response_format={"type": "json_object"})
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.startswith("{")


def test_response_format_strict_json_schema(client):
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=48, temperature=0.8, seed=3, n=2,
        response_format={"type": "json_schema", "json_schema": {
            "name": "weather", "schema": WEATHER, "strict": True}})
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), WEATHER)


def test_tool_choice_required(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=64,
                                       temperature=0, tools=TOOLS, tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls(choice.message.tool_calls)


def test_named_tool_choice(client):
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=64, temperature=0, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    _check_calls([call])


def test_tool_choice_auto_gives_text_or_valid_calls(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48,
                                       temperature=1.0, seed=5, n=3, tools=TOOLS)
    for choice in r.choices:
        if choice.message.tool_calls:
            _check_calls(choice.message.tool_calls)
            assert choice.finish_reason in ("tool_calls", "length")
        else:
            assert isinstance(choice.message.content, str)


def test_streamed_tool_call(client):
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=64,
                                            temperature=0, tools=TOOLS, tool_choice="required",
                                            stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls" and len(calls) == 1
    jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[calls[0]["name"]])


@pytest.mark.parametrize("kwargs, match", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "not": {"required": ["a"]}}}}}, "negation"),
    ({"extra_body": {"regex": "a(?=b)"}}, "lookahead"),
    ({"extra_body": {"ebnf": "root ::= nowhere"}}, "is not defined"),  # found by the compiler
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}}, "x"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "one output constraint"),
])
def test_bad_constraints_are_400s(client, kwargs, match):
    with pytest.raises(openai.BadRequestError, match=match):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **kwargs)
