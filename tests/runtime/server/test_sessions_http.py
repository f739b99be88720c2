"""Sessions over HTTP, as SGLang serves them: POST /open_session -> the session id (a JSON
string), /generate with "session_params", POST /close_session -> 200; and
/concate_and_append_request, which is refused."""

from __future__ import annotations

import json

import pytest
import requests

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}


def post(server, path, body, **kw):
    return requests.post(server.url + path, data=json.dumps(body), headers=JSON_HEADERS,
                         timeout=120, **kw)


def open_session(server, **body) -> str:
    r = post(server, "/open_session", {"capacity_of_str_len": 1000, **body})
    assert r.status_code == 200, r.text
    session_id = r.json()
    assert isinstance(session_id, str) and session_id
    return session_id


def error(r, status=400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_session_continuation_over_http(server, tokenizer):
    sid = open_session(server)
    first = post(server, "/generate", {"text": "Once upon a time", "sampling_params": GREEDY,
                                       "session_params": {"id": sid}}).json()
    rid = first["meta_info"]["id"]
    second = post(server, "/generate", {
        "text": " there was a robot", "sampling_params": GREEDY,
        "session_params": {"id": sid, "rid": rid, "offset": None, "replace": None,
                           "drop_previous_output": None}}).json()
    history = tokenizer.encode("Once upon a time") + first["output_ids"]
    own = tokenizer.encode(" there was a robot")
    meta = second["meta_info"]
    assert meta["prompt_tokens"] == len(history) + len(own)
    assert meta["cached_tokens"] >= len(history) - 1  # not sent, found in the prefix cache
    resent = post(server, "/generate", {"input_ids": history + own,
                                        "sampling_params": GREEDY}).json()
    assert second["output_ids"] == resent["output_ids"]
    # streamed, continuing the second request
    body = {"input_ids": own, "sampling_params": GREEDY, "stream": True,
            "session_params": {"id": sid, "rid": meta["id"]}}
    with post(server, "/generate", body, stream=True) as r:
        assert r.status_code == 200
        events = [json.loads(ln[5:]) for ln in r.iter_lines() if ln and ln != b"data: [DONE]"]
    assert events[-1]["meta_info"]["prompt_tokens"] == len(history) + len(own) * 2 + 6
    r = post(server, "/close_session", {"session_id": sid})
    assert r.status_code == 200 and r.content == b""


def test_closed_or_unknown_session_is_400(server):
    sid = open_session(server)
    first = post(server, "/generate", {"text": "Hello", "sampling_params": GREEDY,
                                       "session_params": {"id": sid}}).json()
    assert post(server, "/close_session", {"session_id": sid}).status_code == 200
    for stream in (False, True):
        r = post(server, "/generate", {"text": " again", "sampling_params": GREEDY,
                                       "stream": stream,
                                       "session_params": {"id": sid,
                                                          "rid": first["meta_info"]["id"]}})
        assert "no open session" in error(r)["message"]
    # closing again, or a session never opened, is 200 (SGLang only logs it)
    assert post(server, "/close_session", {"session_id": sid}).status_code == 200
    sid = open_session(server)
    r = post(server, "/generate", {"text": "x", "sampling_params": GREEDY,
                                   "session_params": {"id": sid, "rid": "no-such-rid"}})
    assert "'no-such-rid' is not a request of session" in error(r)["message"]
    post(server, "/close_session", {"session_id": sid})


def test_open_session_with_an_id_and_capacity(server, tokenizer):
    assert open_session(server, session_id="chat-1", capacity_of_str_len=12) == "chat-1"
    r = post(server, "/open_session", {"capacity_of_str_len": 12, "session_id": "chat-1"})
    assert error(r)["param"] == "session_id" and "already open" in error(r)["message"]
    r = post(server, "/generate", {"text": "The quick brown fox jumps over the lazy dog",
                                   "sampling_params": GREEDY,
                                   "session_params": {"id": "chat-1"}})
    assert "capacity_of_str_len" in error(r)["message"]
    assert post(server, "/close_session", {"session_id": "chat-1"}).status_code == 200
    assert open_session(server, session_id="chat-1") == "chat-1"  # free again once closed
    post(server, "/close_session", {"session_id": "chat-1"})


def test_bad_session_bodies_name_the_field(server):
    cases = [
        ("/open_session", {}, "capacity_of_str_len"),
        ("/open_session", {"capacity_of_str_len": "big"}, "capacity_of_str_len"),
        ("/open_session", {"capacity_of_str_len": 9, "streaming": True}, "streaming"),
        ("/open_session", {"capacity_of_str_len": 9, "timeout": -1}, "timeout"),
        ("/close_session", {}, "session_id"),
        ("/generate", {"text": "x", "session_params": {"id": "s", "extra": 1}},
         "session_params.extra"),
        ("/generate", {"text": "x", "session_params": {"id": "s", "offset": "2"}},
         "session_params.offset"),
        ("/generate", {"text": ["x", "y"], "session_params": {"id": "s"}}, "session_params"),
    ]
    for path, body, param in cases:
        err = error(post(server, path, body))
        assert err["param"] == param, (path, body, err)


def test_concate_and_append_request_is_refused(server):
    r = post(server, "/concate_and_append_request", {"src_rids": ["a"], "dst_rid": "b"})
    err = error(r, 404)
    assert "/concate_and_append_request is not supported" in err["message"]
    assert "/open_session" in err["message"] and "session_params" in err["message"]
    # the server is fine afterwards
    assert requests.get(server.url + "/health", timeout=30).status_code == 200


def test_endpoint_and_runtime_take_the_engine_calls(server, tokenizer):
    from radixflow import Endpoint, InvalidRequest

    endpoint = Endpoint(server.url)
    try:
        sid = endpoint.open_session(500, timeout=60)
        first = endpoint.generate("Hello", GREEDY, session_params={"id": sid})
        more = endpoint.generate(" again", GREEDY,
                                 session_params={"id": sid, "rid": first["meta_info"]["id"]})
        assert more["meta_info"]["prompt_tokens"] == (
            len(tokenizer.encode("Hello")) + 6 + len(tokenizer.encode(" again")))
        endpoint.close_session(sid)
        with pytest.raises(InvalidRequest, match="no open session"):
            endpoint.generate(" x", GREEDY, session_params={"id": sid})
    finally:
        endpoint.shutdown()
