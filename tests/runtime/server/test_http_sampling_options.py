"""stop_regex and logit_bias through `POST /generate` of a live server, against the in-process
Engine on the same body, and the 400s for what the server does not support."""

from __future__ import annotations

import json

import pytest
import regex
import requests
from helpers.live_server import wait_idle

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import InvalidRequest

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def engine(server, tiny_model_dir):
    with Engine(str(tiny_model_dir), max_total_tokens=server.args.max_total_tokens,
                max_running_requests=server.args.max_running_requests) as eng:
        yield eng


@pytest.fixture(scope="module")
def free(engine):
    return engine.generate(PROMPT, GREEDY)


def post(server, body, **kw):
    return requests.post(server.url + "/generate", json=body, timeout=120, **kw)


def untimed(response: dict) -> dict:
    meta = {k: v for k, v in response["meta_info"].items() if k != "e2e_latency"}
    return {**response, "meta_info": meta}


def same_answer(engine, server, body: dict) -> dict:
    """The server's answer to `body`, checked equal to the Engine's (timings aside), each
    from an empty prefix cache."""
    wait_idle(server)
    assert requests.post(server.url + "/flush_cache", timeout=30).status_code == 200
    assert engine.flush_cache()
    r = post(server, body)
    assert r.status_code == 200, r.text
    assert untimed(engine.generate_from_body(body)) == untimed(r.json())
    wait_idle(server)
    return r.json()


def pattern_in(text: str) -> str:
    """A regex (any middle character) that first matches in the middle of `text`."""
    for i in range(len(text) // 3, len(text) - 2):
        if "\ufffd" not in (text[i], text[i + 2]):
            return f"(?s){regex.escape(text[i])}.{regex.escape(text[i + 2])}"
    raise AssertionError(f"no pattern to pick in {text!r}")


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_stop_regex(engine, server, free, no_stop_trim):
    pattern = pattern_in(free["text"])
    match = regex.search(pattern, free["text"])
    body = {"text": PROMPT, "rid": f"stop-regex-{no_stop_trim}",
            "sampling_params": {**GREEDY, "stop_regex": pattern, "no_stop_trim": no_stop_trim}}
    out = same_answer(engine, server, body)
    assert out["text"] == free["text"][:match.end() if no_stop_trim else match.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert out["meta_info"]["completion_tokens"] < GREEDY["max_new_tokens"]


def test_streamed_stop_regex_shows_only_what_the_answer_keeps(server, free):
    pattern = pattern_in(free["text"])
    body = {"text": PROMPT, "stream": True, "sampling_params": {**GREEDY, "stop_regex": [pattern]}}
    with post(server, body, stream=True) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == b"data: [DONE]"
    events = [json.loads(ln[5:]) for ln in lines[:-1]]
    final = post(server, {**body, "stream": False}).json()
    assert events[-1]["text"] == final["text"]
    assert all(final["text"].startswith(e["text"]) for e in events)
    wait_idle(server)


def test_logit_bias_forces_and_bans(engine, server, free):
    forced = next(t for t in range(100, 512) if t not in free["output_ids"])
    out = same_answer(engine, server, {"text": PROMPT, "rid": "forced", "sampling_params": {
        **GREEDY, "logit_bias": {str(forced): 100}}})
    assert out["output_ids"] == [forced] * GREEDY["max_new_tokens"]
    banned = sorted(set(free["output_ids"]))
    out = same_answer(engine, server, {"text": PROMPT, "rid": "banned", "sampling_params": {
        **GREEDY, "logit_bias": {str(t): -100 for t in banned}}})
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
    assert not set(out["output_ids"]) & set(banned)


@pytest.mark.parametrize(("body", "param"), [
    ({"sampling_params": {"stop_regex": "(unclosed"}}, "stop_regex"),
    ({"sampling_params": {"stop_regex": ["ok", "[a-"]}, "stream": True}, "stop_regex"),
    ({"sampling_params": {"logit_bias": {"512": 1}}}, "logit_bias"),
    ({"sampling_params": {"logit_bias": {"3": 101}}}, "logit_bias"),
    ({"sampling_params": {"logit_bias": {"three": 1}}}, "logit_bias"),
    ({"sampling_params": {"custom_params": {"a": 1}}}, "custom_params"),
    ({"sampling_params": {"lora_path": "adapter"}}, "lora_path"),
    ({"lora_path": "adapter"}, "lora_path"),
    ({"lora_path": "adapter", "stream": True}, "lora_path"),
    ({"custom_logit_processor": "{}"}, "custom_logit_processor"),
    ({"return_hidden_states": True}, "return_hidden_states"),
])
def test_refusals_are_400s_naming_the_field(engine, server, body, param):
    body = {"text": PROMPT, **body}
    body["sampling_params"] = {"max_new_tokens": 2, **body.get("sampling_params", {})}
    r = post(server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    with pytest.raises(InvalidRequest) as from_engine:
        engine.generate_from_body(body)
    assert error["message"] == str(from_engine.value)
    wait_idle(server)
