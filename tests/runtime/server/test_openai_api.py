"""The OpenAI-compatible API, driven by the official openai client against a live server."""

from __future__ import annotations

import json

import openai
import pytest
import requests
from helpers.live_server import wait_idle

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]


def test_chat_greedy_usage_and_length(client, tokenizer):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=7,
                                       temperature=0, extra_body={"ignore_eos": True})
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert r.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    again = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=7,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert again.choices[0].message.content == choice.message.content
    # The second request found the whole prompt (but its last token) in the radix cache.
    assert again.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1


def test_chat_stream_matches_non_stream(client):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    full = client.chat.completions.create(**kw).choices[0]
    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == full.finish_reason and all(f is None for f in finishes[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_seed_reproducible_and_n_choices_differ(client):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "temperature": 1.0,
          "seed": 1234, "n": 3, "extra_body": {"ignore_eos": True}}
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1  # each choice has its own random stream
    assert a.usage.completion_tokens == 48


def test_stop_string_cuts_output(client):
    kw = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0,
              "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kw).choices[0].text
    cut = next(i for i in range(2, len(full)) if not full[i].isspace())
    stop = full[cut:cut + 2]
    prefix = full[:full.index(stop)]
    r = client.completions.create(**kw, stop=[stop])
    assert r.choices[0].text == prefix and r.choices[0].finish_reason == "stop"


def test_completions_batch_prompts_and_n(client):
    r = client.completions.create(model="tiny", prompt=["Once upon", "Numbers: 1 2"], n=2,
                                  max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy: both samples of a prompt agree
    assert r.choices[0].text != r.choices[2].text
    assert r.usage.completion_tokens == 12


def test_completions_token_prompt_and_echo_logprobs(client, tokenizer):
    ids = tokenizer.encode("Hello world")
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0,
                                  echo=True, logprobs=2, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.text.startswith(tokenizer.decode(ids))
    lp = c.logprobs
    assert len(lp.tokens) == len(ids) + 3 and lp.token_logprobs[0] is None
    assert all(isinstance(x, float) for x in lp.token_logprobs[1:])
    assert all(len(t) <= 2 for t in lp.top_logprobs[1:])


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=3,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert len(entry.top_logprobs) == 3
        best = max(t.logprob for t in entry.top_logprobs)
        assert entry.logprob == pytest.approx(best, abs=1e-3)  # greedy picks the top token
    joined = bytes(b for e in content for b in e.bytes)
    assert joined.decode("utf-8", "replace") == r.choices[0].message.content


def test_json_schema_response_format(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    value = json.loads(choice.message.content)
    assert set(value) == {"ok"} and isinstance(value["ok"], bool)


@pytest.mark.parametrize("kwargs, param", [
    ({"temperature": 5}, "temperature"),
    ({"n": 0}, "n"),
    ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"max_tokens": 100_000}, "max_tokens"),  # over the context
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"extra_body": {"not_a_field": 1}}, "not_a_field"),
    ({"stop": [""]}, "stop"),
])
def test_bad_chat_requests(client, kwargs, param):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4}
    kw.update(kwargs)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**kw)
    err = info.value.body
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def test_image_part_is_refused_by_name(client):
    parts = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", max_tokens=4,
                                       messages=[{"role": "user", "content": parts}])
    err = info.value.body
    assert err["param"] == "messages.0.content"
    assert err["message"] == ("messages.0.content: part 1 is of type 'image_url': not "
                              "supported; radixflow serves text only (content parts of type "
                              "'text')")


def test_context_overflow_has_openai_code(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="a b " * 400, max_tokens=4000)
    assert info.value.body["code"] == "context_length_exceeded"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES, max_tokens=2)
    assert "gpt-9" in info.value.body["message"]


def test_bad_json_is_400(server):
    r = requests.post(server.url + "/v1/chat/completions", data=b"{not json",
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]
    wait_idle(server)


EMOJI_PROMPT = "Smile 😀 now"


def test_completion_logprobs_keep_the_bytes_of_split_characters(client, tokenizer):
    """The tiny vocab has no merges for the emoji: its four bytes are four tokens, each shown
    as `\\xNN` (not U+FFFD), each at the offset where the emoji starts."""
    r = client.completions.create(model="tiny", prompt=EMOJI_PROMPT, max_tokens=2, logprobs=3,
                                  echo=True, temperature=0, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    ids = tokenizer.encode(EMOJI_PROMPT, add_special_tokens=False)
    prompt_tokens = lp.tokens[:len(ids)]
    assert [t for t in prompt_tokens if "\\x" in t] == ["\\xf0", "\\x9f", "\\x98", "\\x80"]
    decoded = "".join(prompt_tokens).encode().decode("unicode_escape").encode("latin-1")
    assert decoded.decode() == EMOJI_PROMPT
    start = EMOJI_PROMPT.index("😀")
    emoji_at = [k for k, t in enumerate(prompt_tokens) if t.startswith("\\x")]
    assert [lp.text_offset[k] for k in emoji_at] == [start] * 4
    after = emoji_at[-1] + 1
    assert lp.text_offset[after] == start + 1  # the emoji is one character
    assert all("\ufffd" not in t for top in lp.top_logprobs[1:] for t in top)


def test_chat_logprob_bytes_of_a_partial_character(client, tokenizer):
    """Forced (logit_bias) to emit a byte that begins an emoji, and no more of it: each token's
    `bytes` is that byte, not U+FFFD's three."""
    emoji = [tokenizer.convert_tokens_to_ids("ð")]  # byte 0xF0 in the GPT-2 alphabet
    assert tokenizer.unk_token_id not in emoji
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=2, logit_bias={str(emoji[0]): 100}, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert [e.bytes for e in content] == [[0xF0]] * 4
    assert [e.token for e in content] == ["\\xf0"] * 4
    for alt in (a for e in content for a in e.top_logprobs):
        assert bytes(alt.bytes).decode("utf-8", "backslashreplace") == alt.token


def test_streamed_completion_logprobs_cover_every_token(client, tokenizer):
    """Chunks whose tokens end inside a character have no text yet; their logprobs still come."""
    lead = tokenizer.convert_tokens_to_ids("ð")
    chunks = list(client.completions.create(
        model="tiny", prompt="Hi", max_tokens=6, temperature=0, logprobs=1, stream=True,
        logit_bias={str(lead): 100}, extra_body={"ignore_eos": True}))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.tokens]
    assert tokens == ["\\xf0"] * 6


def test_retrieve_model(client):
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    with pytest.raises(openai.NotFoundError, match="'nope' does not exist"):
        client.models.retrieve("nope")


def test_model_list_pages_as_anthropic_does():
    from radixflow.runtime.errors import InvalidRequest
    from radixflow.runtime.server.openai_api import model_page

    names = ["a", "b", "c"]
    assert model_page(names, 1000, None, None) == (names, False)
    assert model_page(names, 2, None, None) == (["a", "b"], True)
    assert model_page(names, 2, "b", None) == (["c"], False)
    assert model_page(names, 1, None, "c") == (["b"], True)
    assert model_page(names, 5, None, "a") == ([], False)
    with pytest.raises(InvalidRequest, match="no model 'z'"):
        model_page(names, 5, "z", None)
