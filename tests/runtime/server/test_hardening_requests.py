"""Requests that cost the server more than their client may ask for (issue #24): a template
the client wrote, batches past --max-prompts-per-request, selects past --max-select-choices,
a /program its client abandoned, and request building that would stall every stream."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
import requests
from helpers.live_server import server_info, wait_idle

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.server.deadline import TimedOut, run_with_deadline
from radixflow.runtime.server.openai_protocol import ChatCompletionRequest
from radixflow.runtime.server.openai_requests import BuildLimits, chat_job, render_chat

# Renders for ~10^10 steps: a render nobody should wait for.
ENDLESS = ("{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}"
           "{% endfor %}")
CHAT = [{"role": "user", "content": "hi"}]
MAX_NEW = 4000  # far more than the server produces before an abort arrives


def post(server, path: str, body: dict, timeout: float = 120) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=timeout)


def error_message(r: requests.Response) -> str:
    return r.json()["error"]["message"]


def metric(server, name: str) -> float:
    for line in requests.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


# -- item 2: the client's chat_template_kwargs carry template variables only -----------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_client_chat_template_is_refused_at_once(server, path):
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 1,
            "chat_template_kwargs": {"chat_template": ENDLESS}}
    if path == "/tokenize":
        del body["max_tokens"]
    t0 = time.monotonic()
    r = post(server, path, body, timeout=30)
    assert time.monotonic() - t0 < 1.0
    assert r.status_code == 400, r.text
    assert "chat_template" in error_message(r)
    assert "--chat-template" in error_message(r)
    assert r.json()["error"]["param"] == "chat_template_kwargs.chat_template"
    # the server still serves
    ok = post(server, "/v1/chat/completions", {"model": "tiny", "messages": CHAT,
                                                "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("key,value", [
    ("tokenize", True), ("return_tensors", "pt"), ("return_dict", True), ("padding", True),
    ("truncation", True), ("max_length", 3), ("tokenizer_kwargs", {"add_special_tokens": True}),
    ("add_generation_prompt", False), ("continue_final_message", True), ("tools", []),
    ("documents", [{"title": "t", "text": "x"}]), ("messages", []), ("conversation", []),
    ("return_assistant_tokens_mask", True), ("__class__", 1), ("not a name", 1),
])
def test_tokenizer_options_in_template_kwargs_are_refused(server, key, value):
    r = post(server, "/v1/chat/completions", {
        "model": "tiny", "messages": CHAT, "max_tokens": 1,
        "chat_template_kwargs": {key: value}}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"chat_template_kwargs.{key}"
    assert repr(key) in error_message(r)


def test_template_variables_still_reach_the_template(server):
    r = post(server, "/v1/chat/completions", {
        "model": "tiny", "messages": CHAT, "max_tokens": 1,
        "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}})
    assert r.status_code == 200, r.text
    tok = post(server, "/tokenize", {"messages": CHAT,
                                     "chat_template_kwargs": {"enable_thinking": True}})
    assert tok.status_code == 200, tok.text


class _SlowTemplateTokenizer:
    """An operator's template that never ends: the render is stopped at its deadline."""

    chat_template = ENDLESS

    def apply_chat_template(self, messages, **kwargs):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        return ImmutableSandboxedEnvironment().from_string(self.chat_template).render(
            messages=messages)


def test_render_is_stopped_at_its_deadline():
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT})
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest, match="took longer than 0.5 s"):
        render_chat(_SlowTemplateTokenizer(), body, limits=BuildLimits(render_timeout=0.5))
    assert time.monotonic() - t0 < 3
    # the thread is free again: nothing pending is raised into it later
    assert run_with_deadline(lambda: sum(range(1000)), 5.0) == sum(range(1000))
    time.sleep(0.2)
    with pytest.raises(TimedOut):
        run_with_deadline(lambda: time.sleep(0.5) or [None for _ in range(10**9)], 0.2)


def test_operator_template_render_is_stopped(tokenizer):
    """Through transformers' apply_chat_template too: a template that never ends, 400."""
    slow = copy.deepcopy(tokenizer)
    slow.chat_template = ENDLESS
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT})
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest, match="rendering the chat template took longer"):
        render_chat(slow, body, limits=BuildLimits(render_timeout=0.5))
    assert time.monotonic() - t0 < 3


def test_rendered_prompt_size_is_bounded(tokenizer):
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
    with pytest.raises(InvalidRequest, match="the limit is 1000"):
        render_chat(tokenizer, body, limits=BuildLimits(max_rendered_chars=1000))


# -- item 4: prompts x n per call, select choices --------------------------------------------

def test_generate_batch_over_the_cap_is_refused(server):
    t0 = time.monotonic()
    r = post(server, "/generate", {"text": ["hello"] * 2000,
                                   "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400, r.text
    assert "2000" in error_message(r) and "--max-prompts-per-request" in error_message(r)
    assert "1024" in error_message(r)
    r = post(server, "/generate", {"input_ids": [[1, 2]] * 1025,
                                   "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and "--max-prompts-per-request" in error_message(r)
    # prompts x n
    r = post(server, "/generate", {"text": ["a"] * 10,
                                   "sampling_params": {"max_new_tokens": 1, "n": 128}})
    assert r.status_code == 400 and "1280" in error_message(r), r.text
    r = post(server, "/generate", {"text": ["a", "b"], "sampling_params": [
        {"max_new_tokens": 1, "n": 128}] + [{"max_new_tokens": 1, "n": 1000 // 2}]})
    assert r.status_code == 400  # n > 128 on its own
    assert time.monotonic() - t0 < 10
    assert wait_idle(server)["num_pending_requests"] == 0
    ok = post(server, "/generate", {"text": ["a", "b"],
                                    "sampling_params": {"max_new_tokens": 1, "n": 3}})
    assert ok.status_code == 200 and len(ok.json()) == 6


def test_completions_over_the_cap_are_refused(server, client):
    with pytest.raises(openai.BadRequestError, match="--max-prompts-per-request"):
        client.completions.create(model="tiny", prompt=["hi"] * 9, n=128, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="--max-prompts-per-request"):
        client.completions.create(model="tiny", prompt=[[1, 2]] * 1100, max_tokens=1)
    r = client.completions.create(model="tiny", prompt=["hi"] * 2, n=2, max_tokens=1)
    assert len(r.choices) == 4


def test_chat_n_is_counted():
    client = SimpleNamespace(tokenizer=None, reasoning=None)
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT, "n": 8})
    with pytest.raises(InvalidRequest, match=r"the limit is 4 \(--max-prompts-per-request\)"):
        chat_job(client, body, None, limits=BuildLimits(max_prompts=4))


def test_select_over_the_cap_is_refused(server):
    choices = [f"choice {i}" for i in range(2000)]
    r = post(server, "/program", {"text": "Pick:", "nodes": [
        {"type": "select", "name": "x", "choices": choices}]})
    assert r.status_code == 400, r.text
    assert "2000 choices" in error_message(r) and "--max-select-choices" in error_message(r)
    # inside a fork too
    r = post(server, "/program", {"text": "Pick:", "nodes": [{"type": "fork", "branches": [[
        {"type": "select", "name": "x", "choices": choices}]]}]})
    assert r.status_code == 400 and "--max-select-choices" in error_message(r)
    ok = post(server, "/program", {"text": "Pick:", "nodes": [
        {"type": "select", "name": "x", "choices": ["yes", "no"]}]})
    assert ok.status_code == 200 and ok.json()["variables"]["x"] in ("yes", "no")


# -- item 7: a /program whose client hung up stops --------------------------------------------

def _long_program(gens: int = 3) -> dict:
    gen = {"type": "gen", "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True,
                                              "temperature": 0}}
    return {"text": "Once upon a time", "nodes": [{**gen, "name": f"g{i}"}
                                                  for i in range(gens)]}


def _send_raw(server, path: str, body: dict) -> socket.socket:
    raw = json.dumps(body).encode()
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(raw), raw))
    return sock


def _wait_pending(server, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server_info(server)["num_pending_requests"] >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} requests ever ran")


def test_abandoned_program_stops(server):
    before = wait_idle(server)
    aborted = metric(server, "radixflow:requests_aborted_total")
    with _send_raw(server, "/program", _long_program()):
        _wait_pending(server, 1)  # its first gen is running
    after = wait_idle(server, timeout=30)
    # the gen in flight was aborted and none after it ran
    assert after["generation_tokens"] - before["generation_tokens"] < MAX_NEW
    assert metric(server, "radixflow:requests_aborted_total") == aborted + 1
    time.sleep(1.0)
    later = server_info(server)
    assert later["num_pending_requests"] == 0
    assert later["generation_tokens"] == after["generation_tokens"]


def test_abandoned_programs_do_not_lock_program_out(server):
    # More abandoned programs than the program pool has threads (max(16, 8) here).
    socks = [_send_raw(server, "/program", _long_program()) for _ in range(20)]
    try:
        _wait_pending(server, 8)
    finally:
        for s in socks:
            s.close()
    t0 = time.monotonic()
    r = post(server, "/program", {"text": "Q:", "nodes": [
        {"type": "gen", "name": "a", "sampling_params": {"max_new_tokens": 2}}]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["error"] is None
    assert time.monotonic() - t0 < 30
    wait_idle(server, timeout=60)


# -- request building runs off the event loop -------------------------------------------------

@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions"])
def test_streams_flow_beside_a_costly_request(server, path):
    wait_idle(server)
    # ~4 MB to tokenize (seconds), then a 400: the logprob window starts past every prompt,
    # or the chat prompt is too long for the context.
    text = "the quick brown fox jumps over the lazy dog " * 90
    costly = ({"text": [text] * 1000, "sampling_params": {"max_new_tokens": 1},
               "return_logprob": True, "logprob_start_len": 100000} if path == "/generate"
              else {"model": "tiny", "max_tokens": 1,
                    "messages": [{"role": "user", "content": text * 400}]})
    answer: dict = {}

    def send_costly() -> None:
        t0 = time.monotonic()
        r = requests.post(server.url + path, json=costly, timeout=120)
        answer.update(status=r.status_code, seconds=time.monotonic() - t0)

    body = {"text": "Once upon a time", "stream": True,
            "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True}}
    gaps: list[float] = []
    worker = threading.Thread(target=send_costly)
    with httpx.Client(timeout=60) as http, http.stream("POST", server.url + "/generate",
                                                       json=body) as r:
        lines = r.iter_lines()
        last = None
        for line in lines:
            if not line.startswith("data: {"):
                continue
            now = time.monotonic()
            if last is None:
                worker.start()
            else:
                gaps.append(now - last)
            last = now
            if not worker.is_alive() and answer:
                break
    worker.join()
    assert answer["status"] == 400
    assert answer["seconds"] > 0.5, "the costly request was not costly"
    assert max(gaps) < 1.0, f"the stream stalled {max(gaps):.2f} s"
    wait_idle(server)
