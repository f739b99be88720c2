"""/v1/messages and /v1/messages/count_tokens with the official anthropic client against the
live tiny-model server: plain, system, multi-turn (the same prompt as chat), stop_sequences,
streaming (client.messages.stream and the raw events in order), a tool round trip,
count_tokens, and the 400s / 404s in Anthropic's error shape."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
import requests
from helpers.live_server import wait_idle

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather now", "input_schema": WEATHER}]
HI = [{"role": "user", "content": "hi"}]
# anthropic 2.x's create() has no temperature (Anthropic's newer models take none); the
# server still reads it, as older clients send it
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                               timeout=120)


def total_input(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens


def test_plain_message(ac):
    m = ac.messages.create(model="tiny", max_tokens=8, messages=HI, extra_body=GREEDY)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == "tiny" and [b.type for b in m.content] == ["text"]
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 0 < m.usage.output_tokens <= 8 and m.usage.cache_creation_input_tokens == 0
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 8
    assert total_input(m.usage) == ac.messages.count_tokens(model="tiny", messages=HI).input_tokens


def test_system_and_turns_render_as_chat_does(ac, client):
    turns = [{"role": "user", "content": "My name is Ada."},
             {"role": "assistant", "content": [{"type": "text", "text": "Hello Ada."}]},
             {"role": "user", "content": [{"type": "text", "text": "What is my name?"}]}]
    kw = dict(model="tiny", max_tokens=6, extra_body=GREEDY, messages=turns)
    a = ac.messages.create(system="Be brief.", **kw)
    b = ac.messages.create(system=[{"type": "text", "text": "Be brief.",
                                    "cache_control": {"type": "ephemeral"}}], **kw)
    chat = client.chat.completions.create(
        model="tiny", extra_body=GREEDY, max_tokens=6,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "My name is Ada."},
                  {"role": "assistant", "content": "Hello Ada."},
                  {"role": "user", "content": "What is my name?"}])
    assert a.content[0].text == b.content[0].text == chat.choices[0].message.content
    assert total_input(a.usage) == total_input(b.usage) == chat.usage.prompt_tokens
    # sent again, the prompt comes from the radix cache: Anthropic's cache_read_input_tokens
    assert b.usage.cache_read_input_tokens > 0
    assert b.usage.input_tokens == chat.usage.prompt_tokens - b.usage.cache_read_input_tokens


def test_prefill_continues_the_assistant_turn(ac):
    m = ac.messages.create(model="tiny", max_tokens=4, extra_body=GREEDY, messages=[
        *HI, {"role": "assistant", "content": "Well,"}])
    assert m.content[0].type == "text"
    prefill = [*HI, {"role": "assistant", "content": "Well,"}]
    n = ac.messages.count_tokens(model="tiny", messages=prefill).input_tokens
    assert total_input(m.usage) == n
    assert n != ac.messages.count_tokens(model="tiny", messages=HI).input_tokens


def test_stop_sequences(ac):
    kw = dict(model="tiny", max_tokens=16, extra_body=GREEDY, messages=[
        {"role": "user", "content": "The quick brown fox"}])
    full = ac.messages.create(**kw).content[0].text
    cut = next(i for i in range(2, len(full)) if not full[i].isspace())
    stop = full[cut:cut + 2]
    m = ac.messages.create(**kw, stop_sequences=["zzzz-never", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == full[:full.index(stop)]


def test_stream_matches_create(ac):
    kw = dict(model="tiny", max_tokens=10, extra_body=GREEDY, messages=HI)
    with ac.messages.stream(**kw) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    plain = ac.messages.create(**kw)
    assert "".join(texts) == final.content[0].text == plain.content[0].text
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert total_input(final.usage) == total_input(plain.usage)


def raw_events(server, body: dict) -> list[tuple[str, dict]]:
    r = requests.post(server.url + "/v1/messages", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = []
    for chunk in r.text.strip().split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        events.append((name[7:], json.loads(data[6:])))
    return events


def test_stream_events_in_order(server):
    events = raw_events(server, {"model": "tiny", "max_tokens": 6, "stream": True,
                                 "messages": HI})
    names = [n for n, _ in events]
    assert all(n == data["type"] for n, data in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert events[-2][1]["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < events[-2][1]["usage"]["output_tokens"] <= 6
    assert events[2][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for _, d in events[3:-3])


def test_tool_round_trip(ac, client):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    m = ac.messages.create(model="tiny", max_tokens=64, extra_body=GREEDY, tools=TOOLS,
                           tool_choice={"type": "any", "disable_parallel_tool_use": True},
                           messages=ask)
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    turns = [*ask, m.to_param(),
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": [{"type": "text", "text": "9C"}]}]}]
    answer = ac.messages.create(model="tiny", max_tokens=4, extra_body=GREEDY, tools=TOOLS,
                                tool_choice={"type": "none"}, messages=turns)
    assert [b.type for b in answer.content] == ["text"]
    assert answer.stop_reason in ("end_turn", "max_tokens")
    # the call and its result are in the prompt as chat renders them
    chat = client.chat.completions.create(model="tiny", max_tokens=1, messages=[
        *ask, {"role": "assistant", "content": None, "tool_calls": [{
            "id": use.id.removeprefix("toolu_"), "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id.removeprefix("toolu_"), "content": "9C"}])
    assert total_input(answer.usage) == chat.usage.prompt_tokens
    # the blocks as the client's models dump them (every field, null ones too) are taken
    error = [*ask, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
             {"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": use.id, "content": "down", "is_error": True}]}]
    counted = ac.messages.count_tokens(model="tiny", messages=error).input_tokens
    # "Error: down" against "9C"
    assert counted > ac.messages.count_tokens(model="tiny", messages=turns).input_tokens


def test_named_tool_streamed(ac, server):
    kw = dict(model="tiny", max_tokens=64, extra_body=GREEDY, tools=TOOLS, messages=HI,
              tool_choice={"type": "tool", "name": "get_weather"})
    with ac.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER)
    assert final.stop_reason == "tool_use"
    body = {k: v for k, v in kw.items() if k != "extra_body"}
    events = raw_events(server, {**body, **GREEDY, "stream": True})
    start = next(d for n, d in events if n == "content_block_start"
                 and d["content_block"]["type"] == "tool_use")
    assert start["content_block"]["input"] == {} and start["content_block"]["id"].startswith(
        "toolu_")
    partial = "".join(d["delta"]["partial_json"] for n, d in events
                      if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == use.input


def test_output_config_json_schema(ac):
    m = ac.messages.create(model="tiny", max_tokens=48, messages=HI, output_config={
        "format": {"type": "json_schema", "schema": WEATHER}})
    jsonschema.validate(json.loads(m.content[0].text), WEATHER)


def test_count_tokens_is_the_prompt(ac):
    kw = dict(model="tiny", system="Be brief.", tools=TOOLS,
              messages=[{"role": "user", "content": "Weather?"}])
    n = ac.messages.count_tokens(**kw).input_tokens
    assert n > ac.messages.count_tokens(model="tiny", messages=kw["messages"]).input_tokens
    m = ac.messages.create(max_tokens=1, **kw)
    assert total_input(m.usage) == n


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}


@pytest.mark.parametrize("kwargs, match", [
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"messages": []}, "messages"),
    ({"max_tokens": 1 << 30}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),  # past the context (4096)
    ({"max_tokens": 0}, "max_tokens"),
    ({"tool_choice": {"type": "sometimes"}, "tools": TOOLS}, "tool_choice"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS}, "nope"),
    ({"tool_choice": {"type": "any"}}, "needs tools"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search"),
    ({"tools": [{"name": "bad name!", "input_schema": WEATHER}]}, "tools.0.name"),
    ({"messages": [{"role": "user", "content": [IMAGE]}]}, "messages.0.content.0.*image"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "document"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "may not hold"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "z": 1}]}]},
     "messages.0.content.0.z"),
    ({"thinking": {"type": "enabled", "budget_tokens": 16}}, "reasoning-parser"),
    ({"extra_body": {"temperature": 1.5}}, "temperature"),
    ({"output_config": {"effort": "high"}}, "output_config.effort"),
    ({"stop_sequences": [""]}, "stop"),
])
def test_bad_requests_are_400s_naming_the_field(ac, kwargs, match):
    kwargs = {"model": "tiny", "max_tokens": 4, "messages": HI, **kwargs}
    with pytest.raises(anthropic.BadRequestError, match=match) as info:
        ac.messages.create(**kwargs)
    assert info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == "invalid_request_error"


def test_missing_max_tokens_and_unknown_model(server, ac):
    r = requests.post(server.url + "/v1/messages", json={"model": "tiny", "messages": HI},
                      timeout=30)
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: Field required"}}
    with pytest.raises(anthropic.NotFoundError, match="not_found_error"):
        ac.messages.create(model="other", max_tokens=1, messages=HI)
    bad = requests.post(server.url + "/v1/messages/count_tokens", data=b"{", timeout=30,
                        headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    # the server is still there
    assert ac.messages.create(model="tiny", max_tokens=1, messages=HI).usage.output_tokens == 1


def test_closed_stream_aborts_its_request(server, ac):
    before = wait_idle(server)
    with ac.messages.stream(model="tiny", max_tokens=4000, messages=HI) as stream:
        for i, _ in enumerate(stream.text_stream):
            if i == 2:
                break
    after = wait_idle(server)  # the request was aborted: nothing runs, no KV held
    assert after["generation_tokens"] - before["generation_tokens"] < 4000


def test_models_list_and_retrieve(ac):
    page = ac.models.list()
    assert [m.id for m in page.data] == ["tiny"] and page.has_more is False
    assert page.first_id == page.last_id == "tiny"
    card = ac.models.retrieve("tiny")
    assert card.type == "model" and card.display_name == "tiny"
    assert card.created_at.year == 1970 and card.max_input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        ac.models.retrieve("nope")
    with pytest.raises(anthropic.BadRequestError, match="limit"):
        ac.models.list(limit=0)
