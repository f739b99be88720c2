"""Tool calls through real servers and the official openai client: tiny random models on real
tokenizers and chat templates (helpers/test_assets.py), one server per format family, started
together.

    server        tokenizer  chat template                  format
    qwen3_coder   qwen3      Qwen3-Coder                    qwen3_coder, from the template
    pythonic      llama3     Llama 3.2 (JSON calls)         pythonic, by --tool-call-parser
    mistral       mistral    Mistral-Nemo                   mistral, from the template

Hermes runs through the shared tiny server (test_openai_tools.py); Llama 3 JSON and every
format's grammar are walked token by token in test_tool_parsers.py.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from helpers.test_assets import template, tiny_model_dir

from radixflow.runtime.server.process import ServerProcess

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "JST"]},
                                         "exact": {"type": "boolean"}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}
SERVERS = {  # name -> (arch, tokenizer preset, template, extra server args)
    "qwen3_coder": ("qwen3", "qwen3", "Qwen3-Coder", {}),
    "pythonic": ("llama", "llama3", "meta-llama-Llama-3.2-3B-Instruct",
                 {"tool_call_parser": "pythonic"}),
    "mistral": ("mistral", "mistral", "mistralai-Mistral-Nemo-Instruct-2407", {}),
}


def _start(name: str) -> ServerProcess:
    arch, tokenizer, chat_template, extra = SERVERS[name]
    folder = tiny_model_dir(arch, tokenizer, chat_template, num_hidden_layers=1)
    return ServerProcess(str(folder), served_model_name="tiny", max_total_tokens=2048,
                         max_running_requests=8, log_level="info", start_timeout=300, **extra)


@pytest.fixture(scope="module")
def servers():
    for name in SERVERS:  # fetch the assets and build the models before the servers start
        arch, tokenizer, chat_template, _ = SERVERS[name]
        tiny_model_dir(arch, tokenizer, chat_template, num_hidden_layers=1)
    with ThreadPoolExecutor(len(SERVERS)) as pool:
        started = dict(zip(SERVERS, pool.map(_start, SERVERS), strict=True))
    yield started
    for server in started.values():
        server.shutdown()


@pytest.fixture(params=list(SERVERS))
def client(request, servers):
    server = servers[request.param]
    return request.param, server, openai.OpenAI(base_url=server.url + "/v1", api_key="unused",
                                                max_retries=0, timeout=120)


def _check(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _create(client, **kwargs):
    return client.chat.completions.create(**{"model": "tiny", "messages": MESSAGES,
                                             "max_tokens": 64, "tools": TOOLS, **kwargs})


def test_the_format_was_chosen(client):
    name, server, _ = client
    with open(server.log_path) as f:
        log = f.read()
    why = "--tool-call-parser" if name == "pythonic" else "the chat template"
    assert f"tool calls: the {name} format ({why})" in log


def test_required_named_and_auto(client):
    name, _, c = client
    r = _create(c, tool_choice="required", temperature=0)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    _check(r.choices[0].message.tool_calls)
    r = _create(c, tool_choice=NAMED, temperature=0, parallel_tool_calls=False)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    _check([call])
    if name == "mistral":
        assert len(call.id) == 9 and call.id.isalnum()  # what its template takes back
    r = _create(c, temperature=1.0, seed=7, n=2, max_tokens=24)
    for choice in r.choices:  # text, or calls that validate
        if choice.message.tool_calls:
            _check(choice.message.tool_calls)
        else:
            assert isinstance(choice.message.content, str)


# A call whose arguments take a dozen tokens or more, so that they stream in pieces.
NOTE = {"type": "object", "properties": {"text": {"type": "string",
                                                  "pattern": "^[a-z ]{64,80}$"}},
        "required": ["text"]}
NOTE_TOOL = {"type": "function", "function": {"name": "write_note", "parameters": NOTE}}


def _stream_call(c, kwargs) -> tuple[dict, int, list[bool], str | None]:
    calls: dict[int, list] = {}
    pieces, chunks, finish = 0, [], None
    for chunk in _create(c, stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.function.name:  # the name comes first, with the call's id
                    assert delta.index not in calls and delta.id and not pieces
                    calls[delta.index] = [delta.function.name, ""]
                if delta.function.arguments:
                    calls[delta.index][1] += delta.function.arguments
                    pieces += 1
            chunks.append(bool(choice.delta.tool_calls))
    return calls, pieces, chunks, finish


def test_calls_stream_as_they_are_generated(client):
    name, _, c = client
    kwargs = {"tools": [TOOLS[1], NOTE_TOOL], "temperature": 0, "max_tokens": 128,
              "tool_choice": {"type": "function", "function": {"name": "write_note"}}}
    whole = _create(c, **kwargs)
    (call,) = whole.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), NOTE)
    # A loaded machine can run the whole (tiny, fast) call before the HTTP process next sends,
    # which then sends it as one piece: up to 3 tries to see it stream.
    for _ in range(3):
        calls, pieces, chunks, finish = _stream_call(c, kwargs)
        assert finish == "tool_calls"
        assert calls == {0: ["write_note", call.function.arguments]}  # as the whole reply
        if pieces >= 3:
            break
    assert pieces >= 3, pieces  # fragments as they are generated, not one final chunk
    assert chunks.index(True) < len(chunks) - 3


def test_past_calls_go_back_through_the_template(client):
    name, _, c = client
    call = {"id": "call_ab12cd34ef56ab12cd34ef56", "type": "function",
            "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "12:00"}]
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, tools=TOOLS,
                                  tool_choice="none")  # Nemo's template wants 9-char ids
    assert r.choices[0].finish_reason in ("stop", "length")


def test_an_unenforceable_schema_is_a_400_naming_keyword_and_path(client):
    _, _, c = client
    bad = {"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}
    with pytest.raises(openai.BadRequestError, match=r"'not' at #/properties/a/not") as info:
        c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, tools=[
            {"type": "function", "function": {"name": "f", "parameters": bad}}])
    assert info.value.body["param"] == "tools.0.function.parameters"


def test_templates_exist():
    for _, _, chat_template, _ in SERVERS.values():
        assert "tools" in template(chat_template)
