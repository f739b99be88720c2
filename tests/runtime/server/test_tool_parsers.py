"""Tool-call formats without a server: the format chosen from real chat templates, each
parser's full-text parse against its streaming parse (split anywhere), and each format's
constraint walked token by token with a real tokenizer (every output the masks allow parses
into calls whose arguments validate against the tool's schema). tests/runtime/server/
test_tool_calls_e2e.py runs the formats through real servers."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from helpers.grammar_walk import random_walk
from helpers.test_assets import load_tokenizer, template
from helpers.tiny_models import make_tiny_tokenizer

from radixflow.runtime.errors import GrammarError
from radixflow.runtime.server.openai_protocol import ChatCompletionRequest
from radixflow.runtime.server.openai_requests import render_chat
from radixflow.runtime.server.openai_tools import plan_tools
from radixflow.runtime.server.tool_parsers import (
    PARSERS,
    ArgsDelta,
    CallStart,
    Text,
    check_parser_name,
    choose_parser,
    get_parser,
)
from radixflow.runtime.server_args import ServerArgs

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "metric": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"},
                                             "maxItems": 2},
    "unit": {"enum": ["C", "F", None]}}, "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
NEMO, SMALL = "mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506"


@pytest.mark.parametrize("name, expected", [
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"), ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"), ("Qwen-Qwen3-0.6B", "hermes"),
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"), ("Qwen3-Coder", "qwen3_coder"),
    ("Qwen3.5-4B", "qwen3_coder"), (NEMO, "mistral"), (SMALL, "mistral"),
    ("unsloth-mistral-Devstral-Small-2507", "mistral"),
])
def test_format_from_the_chat_template(name, expected):
    parser, why = choose_parser(template(name))
    assert (parser.name, why) == (expected, "the chat template")


def test_no_or_several_formats_fall_back_to_hermes_and_the_flag_wins():
    parser, why = choose_parser(template("google-gemma-4-31B-it"))  # tools, another format
    assert parser.name == "hermes" and "no known tool-call format" in why
    parser, why = choose_parser("{{ '<tool_call>\"name\" \"arguments\"' }} [TOOL_CALLS]")
    assert parser.name == "hermes" and "several formats (mistral, hermes)" in why
    parser, why = choose_parser(template("Qwen-Qwen3-0.6B"), "pythonic")
    assert (parser.name, why) == ("pythonic", "--tool-call-parser")
    assert check_parser_name("llama3_json") == "llama3"  # vLLM's and SGLang's names
    assert check_parser_name("qwen25") == "hermes"


def test_an_unknown_parser_is_a_start_up_error_listing_the_choices():
    with pytest.raises(ValueError, match="--tool-call-parser 'nope'.*hermes, llama3, mistral, "
                                         "pythonic, qwen3_coder"):
        ServerArgs(tool_call_parser="nope")
    assert ServerArgs(tool_call_parser="Qwen3-Coder").tool_call_parser == "qwen3_coder"


# ---- parsing: the whole text and the stream agree ----

OUTPUTS = {  # format -> (an output, its content, its calls as (name, arguments))
    "hermes": ('Let me see. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris'
               '", "unit": null}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
               '{"zone": "UTC"}}\n</tool_call>', "Let me see.",
               [("get_weather", {"city": 'Pa"ris', "unit": None}),
                ("get_time", {"zone": "UTC"})]),
    "llama3": ('{"name": "get_weather", "parameters": {"city": "Oslo", "tags": ["a", "b"], '
               '"unit": "C"}}', None,
               [("get_weather", {"city": "Oslo", "tags": ["a", "b"], "unit": "C"})]),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "F"'
                '}}, {"name": "get_time", "arguments": {"zone": "CET"}}]', None,
                [("get_weather", {"city": "Oslo", "unit": "F"}), ("get_time", {"zone": "CET"})]),
    "mistral-args": ('[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}[TOOL_CALLS]get_weather[ARGS]'
                     '{"city": "[ARGS]", "unit": "C"}', None,
                     [("get_time", {"zone": "CET"}),
                      ("get_weather", {"city": "[ARGS]", "unit": "C"})]),
    "pythonic": ('[get_weather(city="Pa,)ri\\"s", days=3, metric=False, tags=["x", "True"], '
                 'unit=None), get_time(zone="UTC")]', None,
                 [("get_weather", {"city": 'Pa,)ri"s', "days": 3, "metric": False,
                                   "tags": ["x", "True"], "unit": None}),
                  ("get_time", {"zone": "UTC"})]),
    "qwen3_coder": ('Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n'
                    '</parameter>\n<parameter=days>\n7\n</parameter>\n<parameter=unit>\n C \n'
                    '</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n'
                    '<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>', "Sure.",
                    [("get_weather", {"city": "New\nYork", "days": 7, "unit": "C"}),
                     ("get_time", {"zone": "CET"})]),
}


def _parser(key: str):
    return get_parser(key.split("-")[0], template(SMALL) if key == "mistral-args" else None)


def _collect(events) -> tuple[str | None, list[tuple[str, str]]]:
    content = "".join(e.text for e in events if isinstance(e, Text)) or None
    calls: list[list[str]] = []
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls)
            calls.append([e.name, ""])
        elif isinstance(e, ArgsDelta):
            calls[e.index][1] += e.text
    return content, [tuple(c) for c in calls]


@pytest.mark.parametrize("key", sorted(OUTPUTS))
def test_full_parse_and_stream_agree(key):
    text, content, expected = OUTPUTS[key]
    parser = _parser(key)
    plan = plan_tools(TOOLS, "auto", None, parser)
    whole = _collect(parser.parse(plan, text))
    assert whole[0] == content
    assert [(n, json.loads(a)) for n, a in whole[1]] == expected
    for seed in range(40):  # the same events however the text is cut into pieces
        rng, stream, events, at = random.Random(seed), parser.stream(plan), [], 0
        while at < len(text):
            step = rng.choice([1, 1, 2, 3, 7])
            events += stream.feed(text[at:at + step])
            at += step
        assert _collect(events + stream.finish()) == whole, seed
    message, finish = plan.message(text, "stop")
    assert finish == "tool_calls" and message["content"] == content
    ids = [c["id"] for c in message["tool_calls"]]
    assert len(set(ids)) == len(ids)
    if key.startswith("mistral"):
        assert all(len(i) == 9 and i.isalnum() for i in ids)  # what its templates require


def test_text_without_calls_and_cut_calls():
    for key in ("hermes", "qwen3_coder", "mistral", "pythonic"):
        plan = plan_tools(TOOLS, "auto", None, _parser(key))
        assert plan.message("  Just text.\n", "stop") == (
            {"role": "assistant", "content": "  Just text.\n"}, "stop")
    plan = plan_tools(TOOLS, "auto", None, _parser("qwen3_coder"))
    message, finish = plan.message("<tool_call>\n<function=get_weather>\n<parameter=city>\nOs",
                                   "length")  # cut inside a call: the call so far
    assert finish == "length" and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "get_weather",
                                                    "arguments": '{"city": "Os'}


# ---- constraints: every output the masks allow parses and validates ----

# The walks use the tests' tiny BPE (512 tokens: a walk over a 150k vocabulary takes
# minutes) but for Mistral, whose markers are special tokens of its own tokenizer.
CASES = [("hermes", "tiny"), ("qwen3_coder", "tiny"), ("llama3", "tiny"), ("pythonic", "tiny"),
         ("mistral", "mistral"), ("mistral-args", "mistral")]
# Strings bounded, so that a random walk ends (a raw XML string closes only by chance).
WALK_WEATHER = {**WEATHER, "properties": {**WEATHER["properties"],
                                          "city": {"type": "string", "maxLength": 12}}}
WALK_TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                                "parameters": WALK_WEATHER}}, TOOLS[1]]
CHOICES = {"auto": "auto", "required": "required",
           "named": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.fixture(scope="module")
def backends():
    from radixflow.runtime.constrained import GrammarBackend

    made = {}

    def get(name: str):
        if name not in made:
            tokenizer = make_tiny_tokenizer() if name == "tiny" else load_tokenizer(name)
            made[name] = (tokenizer, GrammarBackend(tokenizer, len(tokenizer)))
        return made[name]

    yield get
    for _, backend in made.values():
        backend.shutdown()


@pytest.mark.parametrize("key, tokenizer_name", CASES)
@pytest.mark.parametrize("choice", ["required", "named", "no-parallel"])
def test_constrained_outputs_parse_and_validate(backends, key, tokenizer_name, choice):
    tokenizer, backend = backends(tokenizer_name)
    parser = _parser(key)
    plan = plan_tools(WALK_TOOLS, CHOICES.get(choice, "required"), choice != "no-parallel",
                      parser)
    (kind, spec), = plan.sampling_fields().items()
    compiled = backend.compile(kind, spec)
    finished = 0
    for seed in range(3):
        walk = random_walk(backend, backend.new_state(compiled), seed, tokenizer=tokenizer,
                           max_steps=240, soft_budget=16)
        text = tokenizer.decode([t for t in walk.output_ids if t not in backend.stop_token_ids],
                                skip_special_tokens=False)
        message, finish = plan.message(text, "stop" if walk.terminated else "length")
        if not walk.terminated:
            continue  # cut by the walk's step limit
        finished += 1
        calls = message.get("tool_calls")
        assert finish == "tool_calls" and calls and message["content"] is None, text
        for call in calls:
            arguments = json.loads(call["function"]["arguments"])
            jsonschema.validate(arguments, {"get_weather": WALK_WEATHER,
                                            "get_time": TIME}[call["function"]["name"]])
        if choice == "named":
            assert [c["function"]["name"] for c in calls] == ["get_weather"]
        if choice == "no-parallel" or not parser.parallel:
            assert len(calls) == 1
    assert finished, "no walk finished"


@pytest.mark.parametrize("key, tokenizer_name", CASES)
def test_auto_allows_text_or_calls(backends, key, tokenizer_name):
    tokenizer, backend = backends(tokenizer_name)
    plan = plan_tools(TOOLS, "auto", None, _parser(key))
    (kind, spec), = plan.sampling_fields().items()
    compiled = backend.compile(kind, spec)
    for text in ("Hello there.", OUTPUTS[key][0]):
        state = backend.new_state(compiled)
        assert state.matcher.accept_string(text) and state.can_terminate(), text


# ---- schemas the formats cannot enforce: 400s naming the keyword and its path ----

@pytest.mark.parametrize("name", sorted(PARSERS))
def test_unenforceable_schemas_are_refused(name):
    bad = {"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}
    tools = [TOOLS[1], {"type": "function", "function": {"name": "f", "parameters": bad}}]
    with pytest.raises(GrammarError) as info:
        plan_tools(tools, "auto", None, get_parser(name))
    assert "'not' at #/properties/a/not" in info.value.message
    assert info.value.param == "tools.1.function.parameters" and "'f'" in info.value.message


@pytest.mark.parametrize("name", ["pythonic", "qwen3_coder"])
def test_argument_by_name_formats_need_named_properties(name):
    for schema, where in [({"type": "object", "minProperties": 1}, "'minProperties' at "
                                                                   "#/minProperties"),
                          ({"type": "object", "additionalProperties": {"type": "string"}},
                           "'additionalProperties' at #/additionalProperties"),
                          ({"type": "array"}, "'type' at #/type")]:
        tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        with pytest.raises(GrammarError, match=where):
            plan_tools(tools, "auto", None, get_parser(name))


# ---- the real templates: prompts and past calls ----

def _body(messages: list[dict], **extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **extra})


def test_past_calls_render_in_each_template():
    call_id = "call_0123456789abcdef01234567"
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": call_id, "type": "function",
                   "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
               {"role": "tool", "content": "12:00", "tool_call_id": call_id}]
    for name, tok in [(NEMO, "mistral"), ("Qwen3-Coder", "qwen3"),
                      ("meta-llama-Llama-3.2-3B-Instruct", "llama3")]:
        tokenizer = load_tokenizer(tok, name)
        parser, _ = choose_parser(tokenizer.chat_template)
        plan = plan_tools(TOOLS, "auto", None, parser)
        text = render_chat(tokenizer, _body(history), plan, parser)
        assert "get_weather" in text and "12:00" in text
        if parser.name == "mistral":  # Nemo's template requires 9-character ids
            assert parser.history_id(call_id) in text


def test_special_token_markers_keep_special_tokens_in_the_text():
    mistral = get_parser("mistral").bind(load_tokenizer("mistral"), [2])
    assert mistral.special_text and mistral.stop_texts == ("</s>",)
    plan = plan_tools(TOOLS, "required", None, mistral)
    message, _ = plan.message(OUTPUTS["mistral"][0] + "</s>", "stop")
    assert message["content"] is None and len(message["tool_calls"]) == 2
    hermes = get_parser("hermes").bind(load_tokenizer("qwen3"), [151645])
    assert not hermes.special_text  # Qwen's <tool_call> is an added token, not a special one


def test_pythonic_arguments_keep_the_declared_order():
    from radixflow.runtime.server.tool_parsers.pythonic import kwargs_grammar

    schema = {"type": "object", "properties": {"zeta": {"type": "boolean"},
                                               "alpha": {"const": None}},
              "required": ["zeta"]}
    grammar = kwargs_grammar(json.dumps(schema))
    assert 'f0 ::= "zeta=" p0_root s1' in grammar and '"None"' in grammar
    assert 's1 ::= (", alpha=" p1_root s2) | s2' in grammar and '"True"' in grammar
