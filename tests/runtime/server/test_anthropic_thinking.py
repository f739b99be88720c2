"""/v1/messages on a server with --api-key and --reasoning-parser deepseek-r1 (a tiny random
model with Qwen3's tokenizer and DeepSeek-R1's template, whose generation prompt opens
<think>): the anthropic client's x-api-key, 401s in Anthropic's shape, and thinking
(enabled with a budget, disabled, omitted), plain and streamed; and /v1/responses' reasoning
items on the same server."""

from __future__ import annotations

import anthropic
import pytest
import requests
from helpers.test_assets import template_path
from helpers.thinking_model import R1_TEMPLATE, make_thinking_model

from radixflow.runtime.server.process import ServerProcess

KEY = "anthropic-s3cret"
HI = [{"role": "user", "content": "Pick a number."}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    folder = make_thinking_model(tmp_path_factory.mktemp("anthropic-thinking"))
    rt = ServerProcess(str(folder), reasoning_parser="deepseek-r1",
                       chat_template=str(template_path(R1_TEMPLATE)), api_key=KEY,
                       dtype="float32", max_total_tokens=2048, served_model_name="tiny",
                       log_level="warning", start_timeout=300)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def ac(keyed):
    return anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0, timeout=120)


def test_x_api_key_is_the_key(keyed, ac):
    assert ac.messages.count_tokens(model="tiny", messages=HI).input_tokens > 0
    for key in ("nope", None):
        bad = anthropic.Anthropic(base_url=keyed.url, api_key=key, max_retries=0,
                                  auth_token=None if key else "also-wrong")
        with pytest.raises(anthropic.AuthenticationError, match="x-api-key") as info:
            bad.messages.create(model="tiny", max_tokens=1, messages=HI)
        assert info.value.body["error"]["type"] == "authentication_error"
    # every route takes it, and Bearer still works; other routes answer in OpenAI's shape
    models = requests.get(keyed.url + "/v1/models", headers={"x-api-key": KEY}, timeout=30)
    assert models.status_code == 200
    bearer = requests.post(keyed.url + "/v1/messages/count_tokens", timeout=30,
                           headers={"Authorization": f"Bearer {KEY}"},
                           json={"model": "tiny", "messages": HI})
    assert bearer.json()["input_tokens"] > 0
    wrong = requests.get(keyed.url + "/v1/models", headers={"x-api-key": "nope"}, timeout=30)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


def test_thinking_enabled_plain_and_streamed(ac):
    kw = dict(model="tiny", max_tokens=12, messages=HI, extra_body=GREEDY,
              thinking={"type": "enabled", "budget_tokens": 3})
    m = ac.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    thought, answer = m.content
    assert thought.thinking and isinstance(thought.signature, str)
    assert "</think>" not in answer.text and "</think>" not in thought.thinking
    with ac.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = "".join(e.delta.thinking for e in events
                     if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    assert deltas == final.content[0].thinking == thought.thinking
    assert final.content[1].text == answer.text
    assert final.usage.output_tokens == m.usage.output_tokens


def test_thinking_disabled_and_omitted(ac):
    off = ac.messages.create(model="tiny", max_tokens=6, messages=HI, extra_body=GREEDY,
                             thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    hidden = ac.messages.create(model="tiny", max_tokens=12, messages=HI, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": 3,
                                          "display": "omitted"})
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        ac.messages.create(model="tiny", max_tokens=3, messages=HI,
                           thinking={"type": "enabled", "budget_tokens": 3})


@pytest.fixture(scope="module")
def oai(keyed):
    import openai

    return openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_responses_reasoning_items_plain_and_streamed(oai):
    """The same reasoning server through /v1/responses: reasoning.effort is the thinking
    budget, the thinking comes back as a reasoning item (and as its summary when asked for),
    streamed as response.reasoning_text.delta events that add up to it."""
    kw = dict(model="tiny", input="Pick a number.", max_output_tokens=10, temperature=0)
    r = oai.responses.create(reasoning={"effort": "low", "summary": "auto"}, **kw)
    first = r.output[0]
    assert first.type == "reasoning" and first.content[0].type == "reasoning_text"
    thought = first.content[0].text
    assert thought and first.summary[0].text == thought
    closed = oai.responses.create(reasoning={"effort": "none"}, **kw)  # budget 0: no thinking
    assert [i.type for i in closed.output] == ["message"]
    events = list(oai.responses.create(reasoning={"effort": "low"}, stream=True, **kw))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    # all 10 tokens went to thinking: OpenAI's "incomplete" (max_output_tokens), not completed
    assert events[-1].type == "response.incomplete" == f"response.{r.status}"
    final = events[-1].response
    assert "".join(deltas) == thought == final.output[0].content[0].text
    assert not [e for e in events if e.type.startswith("response.reasoning_summary")]
    summarised = list(oai.responses.create(reasoning={"effort": "low", "summary": "auto"},
                                           stream=True, **kw))
    kinds = [e.type for e in summarised if e.type.startswith("response.reasoning_summary")]
    assert kinds[0] == "response.reasoning_summary_part.added"
    assert kinds[-2:] == ["response.reasoning_summary_text.done",
                          "response.reasoning_summary_part.done"]
    summary_deltas = [e.delta for e in summarised
                      if e.type == "response.reasoning_summary_text.delta"]
    assert "".join(summary_deltas) == thought == summarised[-1].response.output[0].summary[0].text
