"""A client that hangs up aborts its request: generation stops and its KV slots come back."""

from __future__ import annotations

import json
import socket
import time

import httpx
import requests
from helpers.live_server import wait_idle

MAX_NEW = 4000  # far more than the server can produce before the abort arrives


def long_body(stream: bool) -> dict:
    return {"text": "Once upon a time there was", "stream": stream,
            "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True,
                                "temperature": 0}}


def aborted_count(server) -> float:
    for line in requests.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("radixflow:requests_aborted_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no aborted counter in /metrics")


def check_aborted(server, before: dict, aborted_before: float) -> None:
    after = wait_idle(server)  # nothing running, no KV held by requests
    assert after["generation_tokens"] - before["generation_tokens"] < MAX_NEW
    assert aborted_count(server) == aborted_before + 1


def test_stream_disconnect(server):
    before, aborted = wait_idle(server), aborted_count(server)
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", server.url + "/generate", json=long_body(True)) as r:
        # NOTE: keep a reference: a dropped line iterator closes the connection itself.
        lines = r.iter_lines()
        events = 0
        for line in lines:
            if line.startswith("data: {"):
                events += 1
                if events == 2:
                    break
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
        assert info["num_pending_requests"] == 1  # still running while the client waits
    check_aborted(server, before, aborted)


def test_non_stream_disconnect(server):
    before, aborted = wait_idle(server), aborted_count(server)
    body = json.dumps(long_body(False)).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until the server is working on it
            info = requests.get(server.url + "/get_server_info", timeout=30).json()
            if info["num_pending_requests"] == 1:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the request never started")
    check_aborted(server, before, aborted)


def test_openai_stream_close(server, client):
    before, aborted = wait_idle(server), aborted_count(server)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=MAX_NEW, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    check_aborted(server, before, aborted)
