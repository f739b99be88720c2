"""Every field of the openai package's chat and completions requests is served, a documented
no-op or refused by name (openai_fields.py), checked through the openai client."""

from __future__ import annotations

import typing
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest

from radixflow.runtime.reasoning import ReasoningParser
from radixflow.runtime.server.openai_fields import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    EFFORT_BUDGET,
    REFUSED,
)
from radixflow.runtime.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from radixflow.runtime.server.openai_requests import BuildLimits, chat_job

DOCS = Path(__file__).resolve().parents[3] / "docs" / "server-api.md"
HI = [{"role": "user", "content": "Hi"}]


def openai_keys(module) -> set[str]:
    """The keys of a create() params module's TypedDicts (streaming and not)."""
    keys: set[str] = set()
    for name in ("CompletionCreateParamsNonStreaming", "CompletionCreateParamsStreaming"):
        params = getattr(module, name)
        keys |= set(params.__required_keys__) | set(params.__optional_keys__)
        keys |= set(typing.get_type_hints(params))
    return keys


@pytest.mark.parametrize("module, table, model", [
    (openai.types.chat.completion_create_params, CHAT_FIELDS, ChatCompletionRequest),
    (openai.types.completion_create_params, COMPLETION_FIELDS, CompletionRequest),
])
def test_every_openai_field_is_served_a_no_op_or_refused(module, table, model):
    keys = openai_keys(module)
    assert "messages" in keys or "prompt" in keys  # (the walk found the fields)
    assert sorted(keys - set(table)) == [], "new OpenAI fields: give each a treatment"
    # each is a field of the request model (not an 'extra field' type error)
    assert sorted(set(table) - set(model.model_fields)) == []


def test_the_docs_list_every_field():
    text = DOCS.read_text()
    section = text[text.index("## OpenAI request fields"):]
    section = section[:section.index("\n## ", 3)]
    missing = [f for f in {*CHAT_FIELDS, *COMPLETION_FIELDS} if f"`{f}`" not in section]
    assert missing == []


def test_bookkeeping_fields_succeed(client):
    r = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=2, store=True, metadata={"team": "a"},
        service_tier="auto", reasoning_effort="low", user="u1", safety_identifier="s1",
        prompt_cache_key="k", prompt_cache_retention="24h", verbosity="medium",
        modalities=["text"], prediction={"type": "content", "content": "Hello"},
        parallel_tool_calls=True, stream_options=None)
    assert r.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=2, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False})
    assert [c.usage for c in stream][-1].completion_tokens == 2


@pytest.mark.parametrize("field, value", [
    ("web_search_options", {}), ("audio", {"voice": "alloy", "format": "wav"}),
    ("moderation", {"model": "omni-moderation-latest"}),
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ("function_call", "auto"), ("modalities", ["text", "audio"]), ("verbosity", "low"),
])
def test_refused_fields_name_themselves(client, field, value):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=1,
                                       **{field: value})
    assert info.value.body["param"] == field and field in info.value.body["message"]
    if CHAT_FIELDS[field][0] == REFUSED:
        assert CHAT_FIELDS[field][1] in info.value.body["message"]  # and says why


@pytest.mark.parametrize("metadata, param", [
    ({f"k{i}": "v" for i in range(17)}, "metadata"), ({"k" * 65: "v"}, "metadata." + "k" * 64),
    ({"k": "v" * 513}, "metadata.k"), ({"k": 1}, "metadata.k"),
])
def test_metadata_is_bounded_as_openai_does(client, metadata, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=1,
                                       metadata=metadata)
    assert info.value.body["param"] == param


def test_unknown_fields_stay_400s(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=1,
                                       extra_body={"not_a_field": 1})
    assert info.value.body["param"] == "not_a_field"


def test_vllm_extras_priority_and_cache_salt(client):
    for create, first in ((client.chat.completions.create, {"messages": HI}),
                          (client.completions.create, {"prompt": "Hi"})):
        r = create(model="tiny", max_tokens=1, **first,
                   extra_body={"priority": 0, "cache_salt": "tenant-a", "routed_dp_rank": 0})
        assert r.usage.completion_tokens == 1
        with pytest.raises(openai.BadRequestError, match="--enable-priority-scheduling"):
            create(model="tiny", max_tokens=1, **first, extra_body={"priority": 1})
        for salt in ("", "s" * 1025):
            with pytest.raises(openai.BadRequestError) as info:
                create(model="tiny", max_tokens=1, **first, extra_body={"cache_salt": salt})
            assert info.value.body["param"] == "cache_salt"
        with pytest.raises(openai.BadRequestError, match="not a replica"):
            create(model="tiny", max_tokens=1, **first, extra_body={"routed_dp_rank": 3})


@pytest.fixture(scope="module")
def thinking_client():
    """What chat_job reads of a server with --reasoning-parser qwen3 (Qwen3's template)."""
    from helpers.test_assets import load_tokenizer
    from helpers.thinking_model import QWEN3_TEMPLATE

    tok = load_tokenizer("qwen3", QWEN3_TEMPLATE)
    return SimpleNamespace(tokenizer=tok, reasoning=ReasoningParser.load("qwen3", tok),
                           context_length=4096, vocab_size=len(tok))


def effort_job(client, **fields):
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": HI, **fields})
    return chat_job(client, body, None, limits=BuildLimits())


@pytest.mark.parametrize("effort", ["low", "medium", "high", "xhigh"])
def test_reasoning_effort_is_a_thinking_budget(thinking_client, effort):
    job = effort_job(thinking_client, reasoning_effort=effort)
    assert job.reqs[0].sampling.thinking_budget == EFFORT_BUDGET[effort]
    assert "</think>" not in job.prompt_texts[0]  # the model may think


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_reasoning_effort_none_turns_thinking_off(thinking_client, effort):
    job = effort_job(thinking_client, reasoning_effort=effort)
    assert job.reqs[0].sampling.thinking_budget == 0
    assert job.prompt_texts[0].rstrip().endswith("</think>")  # the template closed it


def test_explicit_fields_win_over_reasoning_effort(thinking_client):
    job = effort_job(thinking_client, reasoning_effort="none", thinking_budget=7,
                     chat_template_kwargs={"enable_thinking": True})
    assert job.reqs[0].sampling.thinking_budget == 7
    assert "</think>" not in job.prompt_texts[0]
    assert effort_job(thinking_client, reasoning_effort="max").reqs[0].sampling \
        .thinking_budget is None


def test_reasoning_effort_is_a_no_op_without_a_parser(thinking_client):
    plain = SimpleNamespace(**{**vars(thinking_client), "reasoning": None})
    job = effort_job(plain, reasoning_effort="none")
    assert job.reqs[0].sampling.thinking_budget is None
    assert "</think>" not in job.prompt_texts[0]
