"""SGLang's POST /abort_request: stop a request by its rid from another connection."""

from __future__ import annotations

import json
import threading

import requests

JSON_HEADERS = {"Content-Type": "application/json"}
LONG = {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}


def post(server, path, body, **kw):
    return requests.post(server.url + path, data=json.dumps(body), headers=JSON_HEADERS,
                         timeout=120, **kw)


def events(response):
    for line in response.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


def test_abort_ends_a_stream_with_an_abort_finish(server):
    with post(server, "/generate", {"text": "Once upon a time", "rid": "abort-me",
                                    "sampling_params": LONG, "stream": True},
              stream=True) as r:
        assert r.status_code == 200
        stream = events(r)
        first = next(stream)
        assert first["meta_info"]["finish_reason"] is None
        abort = post(server, "/abort_request", {"rid": "abort-me"})
        assert abort.status_code == 200
        last = list(stream)[-1]
    reason = last["meta_info"]["finish_reason"]
    assert reason["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < LONG["max_new_tokens"]


def test_abort_all_stops_every_live_request(server):
    results: list = []

    def run(k):
        r = post(server, "/generate", {"text": f"story {k}", "rid": f"all-{k}",
                                       "sampling_params": LONG})
        results.append(r.json()["meta_info"]["finish_reason"]["type"])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    # (wait until both run: the server lists its pending requests)
    for _ in range(600):
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
        if info["num_pending_requests"] >= 2:
            break
        threading.Event().wait(0.05)
    assert post(server, "/abort_request", {"abort_all": True}).status_code == 200
    for t in threads:
        t.join(timeout=120)
    assert results == ["abort", "abort"]


def test_unknown_rids_are_a_200_and_bad_bodies_400s(server):
    assert post(server, "/abort_request", {"rid": "no-such-request"}).status_code == 200
    assert post(server, "/abort_request", {}).status_code == 200
    for body, param in (({"rid": 5}, "rid"), ({"abort_all": "yes"}, "abort_all"),
                        ({"rid": "x", "bogus": 1}, "bogus"), ({"rid": "x" * 2000}, "rid")):
        r = post(server, "/abort_request", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
