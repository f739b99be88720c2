"""Budget-safe structured output over HTTP: `meta_info.closed_early` on /generate, and
`choices[i].closed_early` on the OpenAI routes (stream: on the choice's last chunk), with the
request switches `budget_safe` and `max_repeat_run` accepted by both."""

from __future__ import annotations

import json

import requests

SCHEMA = {"type": "object",
          "properties": {"id": {"type": "string"}, "n": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["id", "n", "tags"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "loopy", "schema": SCHEMA}}


def post(server, path: str, body: dict, **kw) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120, **kw)


def chat_body(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "JSON please"}],
            "max_tokens": 40, "temperature": 1.5, "seed": 3, "n": 6,
            "response_format": FORMAT, **extra}


def test_generate_reports_closed_early(server):
    params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 40, "temperature": 1.5}
    outs = post(server, "/generate", {"text": ["a b"] * 6, "sampling_params": [
        {**params, "seed": i} for i in range(6)]}).json()
    closed = [o for o in outs if o["meta_info"].get("closed_early")]
    assert closed
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        json.loads(out["text"])


def test_openai_choices_say_closed_early(server):
    body = post(server, "/v1/chat/completions", chat_body()).json()
    closed = [c for c in body["choices"] if c.get("closed_early")]
    assert closed, body
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop"
        json.loads(choice["message"]["content"])
    off = post(server, "/v1/chat/completions", chat_body(budget_safe=False)).json()
    assert not any(c.get("closed_early") for c in off["choices"])
    assert any(c["finish_reason"] == "length" for c in off["choices"])


def test_openai_stream_marks_the_last_chunk(server):
    with post(server, "/v1/chat/completions", chat_body(stream=True), stream=True) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith(b"data: {")]
    marked = [c for chunk in chunks for c in chunk["choices"] if c.get("closed_early")]
    assert marked
    assert all(c["finish_reason"] == "stop" for c in marked)


def test_openai_completions_and_max_repeat_run(server):
    body = post(server, "/v1/completions", {
        "model": "tiny", "prompt": "a b", "max_tokens": 40, "temperature": 1.5, "seed": 3,
        "n": 6, "response_format": FORMAT, "max_repeat_run": 3}).json()
    assert all(c["finish_reason"] == "stop" for c in body["choices"]), body
    bad = post(server, "/v1/completions", {"model": "tiny", "prompt": "a",
                                           "max_repeat_run": 1})
    assert bad.status_code == 400
