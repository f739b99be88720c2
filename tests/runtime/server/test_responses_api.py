"""/v1/responses with the official openai client against the live tiny-model server: plain,
streamed (the documented events in order), function tools, text.format json_schema,
previous_response_id, store: false, retrieve, delete, input_items, logprobs, and the 400s / 404s."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import requests

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather now",
          "parameters": WEATHER, "strict": True}]


def test_plain_text(client):
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=8, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"
    assert r.output_text == item.content[0].text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 0
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_same_prompt_as_chat_and_cached_tokens(client):
    """instructions are the system message; the rendered prompt is chat's (same tokens), and
    sent twice its prefix comes from the radix cache."""
    kw = dict(model="tiny", temperature=0, max_output_tokens=6)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Tell me a story"}]}]
    a = client.responses.create(input=items, instructions="Be brief.", **kw)
    b = client.responses.create(input=items, instructions="Be brief.", **kw)
    chat = client.chat.completions.create(
        model="tiny", temperature=0, max_tokens=6,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Tell me a story"}])
    assert a.output_text == b.output_text == chat.choices[0].message.content
    assert a.usage.input_tokens == chat.usage.prompt_tokens
    assert b.usage.input_tokens_details.cached_tokens > 0


def test_stream_events_in_order(client):
    events = list(client.responses.create(model="tiny", input="hi", max_output_tokens=10,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", kinds[-1]]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == events[-4].text
    assert final.output[0].id == events[2].item.id and final.usage.output_tokens > 0
    # the streamed response is stored as it ended
    assert client.responses.retrieve(final.id).output_text == deltas


LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}


def test_logprobs_as_chat_gives_them(client):
    """include message.output_text.logprobs: the text's tokens, their logprobs, bytes and
    top alternatives, the same numbers chat completions gives for the same prompt."""
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=6, temperature=0,
                                **LOGPROBS)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=2)
    part = r.output[0].content[0]
    expected = chat.choices[0].logprobs.content
    assert len(part.logprobs) == len(expected) == r.usage.output_tokens > 0
    for got, want in zip(part.logprobs, expected, strict=True):
        assert (got.token, got.bytes) == (want.token, want.bytes)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert [t.token for t in got.top_logprobs] == [t.token for t in want.top_logprobs]
    joined = bytes(b for lp in part.logprobs for b in lp.bytes)
    assert joined.decode("utf-8", "replace") == part.text
    plain = client.responses.create(model="tiny", input="hi", max_output_tokens=6)
    assert plain.output[0].content[0].logprobs == []


def test_streamed_logprobs_ride_on_the_text_deltas(client):
    events = list(client.responses.create(model="tiny", input="hi", max_output_tokens=8,
                                          temperature=0, stream=True, **LOGPROBS))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [lp for e in deltas for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response.output[0].content[0]
    assert [lp.token for lp in done.logprobs] == [lp.token for lp in final.logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in final.logprobs][:len(streamed)]
    assert len(final.logprobs) == events[-1].response.usage.output_tokens
    assert all(len(lp.top_logprobs) == 2 for lp in final.logprobs)


def test_top_logprobs_need_the_include(client):
    with pytest.raises(openai.BadRequestError, match="message.output_text.logprobs"):
        client.responses.create(model="tiny", input="hi", max_output_tokens=4, top_logprobs=2)


def test_function_tool_required(client):
    r = client.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS,
                                tool_choice="required", max_output_tokens=64, temperature=0)
    calls = [i for i in r.output if i.type == "function_call"]
    assert calls and r.status == "completed"
    for call in calls:
        assert call.name == "get_weather" and call.call_id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), WEATHER)
    # the tool's result goes back as a function_call_output item: the conversation goes on
    nxt = client.responses.create(
        model="tiny", previous_response_id=r.id, max_output_tokens=4, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "9C"}])
    assert nxt.previous_response_id == r.id and nxt.output[0].type == "message"


def test_named_tool_streamed(client):
    events = list(client.responses.create(
        model="tiny", input="Weather?", tools=TOOLS, max_output_tokens=64, temperature=0,
        tool_choice={"type": "function", "name": "get_weather"}, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done.arguments == args and done.name == "get_weather"
    jsonschema.validate(json.loads(args), WEATHER)
    final = events[-1].response
    assert kinds[-1] == "response.completed"
    assert [i.arguments for i in final.output if i.type == "function_call"] == [args]


def test_json_schema_text_format(client):
    r = client.responses.create(
        model="tiny", input="Weather?", max_output_tokens=48, temperature=0.7,
        text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER,
                         "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), WEATHER)
    assert r.text.format.type == "json_schema"


def test_previous_response_id_continues_from_the_cache(client):
    first = client.responses.create(model="tiny", input="My name is Ada.",
                                    max_output_tokens=4, temperature=0)
    second = client.responses.create(model="tiny", input="What is my name?",
                                     previous_response_id=first.id, max_output_tokens=4,
                                     temperature=0)
    # the first turn's prompt (and more) is reused rather than sent again
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
    listed = client.responses.input_items.list(second.id, order="asc")
    texts = [i.content[0].text for i in listed.data if i.type == "message"]
    assert texts == ["My name is Ada.", first.output_text, "What is my name?"]


def test_store_false_retrieve_delete(client):
    gone = client.responses.create(model="tiny", input="hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="hi", previous_response_id=gone.id)
    kept = client.responses.create(model="tiny", input="hi", max_output_tokens=2,
                                   metadata={"k": "v"})
    got = client.responses.retrieve(kept.id)
    assert got.output_text == kept.output_text and got.metadata == {"k": "v"}
    with pytest.raises(openai.BadRequestError, match="status"):
        client.responses.cancel(kept.id)  # done already
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


def test_cancel_a_running_stream(server, client):
    stream = client.responses.create(model="tiny", input="Count", max_output_tokens=2000,
                                     stream=True, extra_body={"top_k": 1000})
    created = next(iter(stream)).response
    cancelled = requests.post(f"{server.url}/v1/responses/{created.id}/cancel", timeout=30)
    assert cancelled.status_code == 200
    kinds = [e.type for e in stream]
    assert kinds[-1] == "response.failed"
    assert client.responses.retrieve(created.id).status == "cancelled"


@pytest.mark.parametrize("kwargs, match", [
    ({"tools": [{"type": "web_search"}]}, "web_search"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "file_search"),
    ({"background": True}, "background"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input_image"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input_image"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"truncation": "auto"}, "truncation"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "schema"),
    ({"input": []}, "input"),
])
def test_refused_requests_are_400s_naming_the_field(client, kwargs, match):
    kwargs.setdefault("input", "hi")
    with pytest.raises(openai.BadRequestError, match=match):
        client.responses.create(model="tiny", max_output_tokens=kwargs.pop(
            "max_output_tokens", 4), **kwargs)


def test_unknown_model_and_ids_are_404s(client):
    with pytest.raises(openai.NotFoundError, match="resp_nope"):
        client.responses.create(model="tiny", input="hi", previous_response_id="resp_nope")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other", input="hi")
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_nope")


def test_reasoning_effort_without_a_reasoning_parser_is_a_no_op(client):
    """As chat's reasoning_effort (Codex sends one whatever the model): no reasoning item."""
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=3,
                                reasoning={"effort": "high"})
    assert [i.type for i in r.output] == ["message"]
    assert 1 <= r.usage.output_tokens <= 3 and r.usage.output_tokens_details.reasoning_tokens == 0


def test_a_delta_takes_the_tokens_of_whole_characters():
    from radixflow.runtime.server.responses_stream import whole_characters

    emoji = "😀".encode()
    assert whole_characters([b"a", emoji[:2], emoji[2:], b" b"]) == 4
    assert whole_characters([b"a", emoji[:2]]) == 1  # the emoji's start waits for its end
    assert whole_characters([emoji[:1], emoji[1:3]]) == 0
    assert whole_characters([b"\x9f", b"x"]) == 2  # a stray byte is no character to wait for
    assert whole_characters([]) == 0
