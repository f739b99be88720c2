"""`radixflow router` in front of two `radixflow serve` workers.

It proxies generation (streamed or not, native and OpenAI), model info and health; sends
prompts that share a prefix to one worker (cache_aware); reports each worker's load and cache
hit rate; flushes every worker; retries a request that had not started (a worker answering
503, a killed worker) on the other, and removes the dead worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from helpers.http_stub import ServedApp
from helpers.live_server import RouterProcess

from radixflow.runtime.server.process import ServerProcess, free_port

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
ADMIN = "router-admin-key"


@pytest.fixture(scope="module")
def workers(tiny_model_dir):
    started = [ServerProcess(str(tiny_model_dir), max_total_tokens=2048, served_model_name="tiny",
                             log_level="warning", start_timeout=300) for _ in range(2)]
    yield started
    for w in started:
        w.shutdown()


@pytest.fixture(scope="module")
def router(workers):
    rt = RouterProcess("--worker-urls", *[w.url for w in workers], "--admin-api-key", ADMIN,
                       "--health-check-interval", "0.5", "--health-failure-threshold", "2")
    yield rt
    assert rt.stop() == 0


def generate(url, text, **extra):
    r = requests.post(url + "/generate", json={"text": text, "sampling_params": GREEDY, **extra},
                      timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def workers_info(router) -> dict[str, dict]:
    info = requests.get(router.url + "/get_server_info", timeout=30).json()
    return {w["url"]: w for w in info["workers"]}


def routed(router) -> dict[str, int]:
    return {url: w["routed_requests"] for url, w in workers_info(router).items()}


def test_proxies_generate_and_info(router, workers):
    for text in ("Once upon a time", "The capital of France is"):
        assert generate(router.url, text)["text"] == generate(workers[0].url, text)["text"]
    batch = requests.post(router.url + "/generate", timeout=120,
                          json={"text": ["a b c", "d e f"], "sampling_params": GREEDY}).json()
    assert len(batch) == 2 and all(b["meta_info"]["completion_tokens"] == 8 for b in batch)
    assert requests.get(router.url + "/get_model_info", timeout=30).json()["model_path"] == \
        requests.get(workers[0].url + "/get_model_info", timeout=30).json()["model_path"]
    models = requests.get(router.url + "/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == "tiny"
    assert requests.get(router.url + "/health", timeout=30).status_code == 200
    bad = requests.post(router.url + "/generate", data=b"{not json", timeout=30,
                        headers={"Content-Type": "application/json"})
    assert bad.status_code == 400  # the worker's answer, relayed


def test_proxies_streams(router, workers):
    body = {"text": "Tell me a story", "sampling_params": GREEDY, "stream": True}
    with requests.post(router.url + "/generate", json=body, stream=True, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == b"data: [DONE]"
    last = json.loads(events[-2].removeprefix(b"data: "))
    assert last["text"] == generate(workers[0].url, "Tell me a story")["text"]

    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Say hello"}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                          temperature=0)
    chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                            temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    completion = client.completions.create(model="tiny", prompt="Numbers: 1 2", max_tokens=4,
                                           temperature=0)
    assert completion.usage.completion_tokens == 4


def test_shared_prefix_goes_to_one_worker(router, workers):
    system = "You are a pirate who answers every question with a long sea story. " * 3
    before = routed(router)
    metas = [generate(router.url, system + f"Question {i}?")["meta_info"] for i in range(4)]
    deltas = {u: n - before[u] for u, n in routed(router).items()}
    assert sorted(deltas.values()) == [0, 4], deltas
    assert all(m["cached_tokens"] > 0 for m in metas[1:]), metas
    owner = max(deltas, key=deltas.get)
    time.sleep(1.2)  # the workers' stats come every 0.5 s
    info = workers_info(router)[owner]
    assert info["cache_hit_tokens"] > 0 and 0 < info["cache_hit_rate"] <= 1
    assert info["cache_routed_requests"] >= 3 and info["load"] == 0 and info["healthy"]
    workers_route = requests.get(router.url + "/workers", timeout=30).json()
    assert {w["url"] for w in workers_route["workers"]} == {w.url for w in workers}
    metrics = requests.get(router.url + "/metrics", timeout=30).text
    assert f'radixflow_router:worker_routed_requests_total{{worker="{owner}"}}' in metrics


def test_flush_cache_reaches_every_worker(router, workers):
    text = "A prompt long enough to stay in the radix cache for a while. " * 2
    generate(router.url, text)
    assert generate(router.url, text)["meta_info"]["cached_tokens"] > 0
    r = requests.post(router.url + "/flush_cache", timeout=60,
                      headers={"Authorization": f"Bearer {ADMIN}"})  # a management route
    assert r.status_code == 200, r.text
    assert all(w["tree_chars"] == 0 for w in workers_info(router).values())
    assert generate(router.url, text)["meta_info"]["cached_tokens"] == 0


def test_a_stored_response_is_continued_on_the_worker_that_holds_it(router, workers):
    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    first = client.responses.create(model="tiny", max_output_tokens=4, input="Name a bird.",
                                    instructions="You answer in one word, about birds. " * 4)
    holders = [w.url for w in workers
               if requests.get(f"{w.url}/v1/responses/{first.id}", timeout=30).ok]
    assert len(holders) == 1
    before = routed(router)
    # Another conversation's prompt would go elsewhere by the policy; the id decides instead.
    second = client.responses.create(model="tiny", max_output_tokens=4, input="And a fish?",
                                     previous_response_id=first.id)
    assert second.usage.input_tokens_details.cached_tokens > 0  # that worker's radix cache
    deltas = {u: n - before[u] for u, n in routed(router).items()}
    assert deltas[holders[0]] == 1 and sum(deltas.values()) == 1
    assert client.responses.retrieve(second.id).id == second.id
    assert [i.type for i in client.responses.input_items.list(second.id).data]
    client.responses.delete(first.id)
    for call in (lambda: client.responses.retrieve(first.id),
                 lambda: client.responses.create(model="tiny", input="again",
                                                 previous_response_id=first.id)):
        with pytest.raises(openai.NotFoundError, match=first.id):
            call()


def test_the_other_apis_are_relayed(router, workers):
    r = requests.post(router.url + "/v1/embeddings", timeout=30,
                      json={"model": "tiny", "input": "hello"})
    assert r.status_code == 400 and "--is-embedding" in r.text  # the worker's own answer
    r = requests.get(router.url + "/v1/responses/" + "x" * 500, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
    import anthropic

    ac = anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Hello there"}]
    reply = ac.messages.create(model="tiny", max_tokens=3, messages=messages, system="Be brief.")
    assert reply.type == "message" and reply.usage.output_tokens == 3
    count = ac.messages.count_tokens(model="tiny", messages=messages, system="Be brief.")
    assert count.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    with ac.messages.stream(model="tiny", max_tokens=3, messages=messages) as stream:
        assert stream.get_final_message().stop_reason == "max_tokens"


def idle_workers(workers, router, timeout: float = 60.0) -> list[dict]:
    """The workers' server info once none runs a request and the router counts no load."""
    deadline = time.monotonic() + timeout
    while True:
        infos = [requests.get(w.url + "/get_server_info", timeout=30).json() for w in workers]
        loads = [w["load"] for w in workers_info(router).values()]
        if all(i["num_pending_requests"] == 0 for i in infos) and not any(loads):
            return infos
        assert time.monotonic() < deadline, (infos, loads)
        time.sleep(0.2)


def test_a_client_that_hangs_up_aborts_on_the_worker(router, workers):
    import socket

    import httpx

    long = {"max_new_tokens": 1900, "temperature": 0, "ignore_eos": True}
    before = idle_workers(workers, router)
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", router.url + "/generate",
            json={"text": "Once upon a time", "sampling_params": long, "stream": True}) as r:
        lines = r.iter_lines()  # NOTE: keep a reference: a dropped iterator closes the stream
        next(line for line in lines if line.startswith("data: {"))
        assert sum(w["load"] for w in workers_info(router).values()) == 1
    # Non-streamed: the router waits for the worker's headers when the client leaves.
    body = json.dumps({"text": "Numbers: 1 2 3", "sampling_params": long}).encode()
    host, port = router.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while sum(w["load"] for w in workers_info(router).values()) != 1:
            assert time.monotonic() < deadline, "the request never reached a worker"
            time.sleep(0.05)
        time.sleep(0.3)
    after = idle_workers(workers, router)
    generated = sum(a["generation_tokens"] - b["generation_tokens"]
                    for a, b in zip(after, before, strict=True))
    assert generated < 2 * 1900  # both were cut short


def test_a_503_before_any_byte_is_retried_on_another_worker(workers):
    from fastapi import FastAPI
    from starlette.responses import Response

    stub = FastAPI()
    hits = []

    @stub.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @stub.post("/generate")
    async def refuse() -> Response:
        hits.append(1)
        return Response(b'{"message": "shutting down"}', status_code=503)

    served = ServedApp(stub)
    # round_robin: the stub (listed first) gets the first request.
    rt = RouterProcess("--worker-urls", served.url, workers[0].url, "--policy", "round_robin",
                       "--health-check-interval", "60")
    try:
        out = generate(rt.url, "Once upon a time")
        assert hits == [1] and out["meta_info"]["completion_tokens"] == 8
        info = requests.get(rt.url + "/get_server_info", timeout=30).json()
        assert info["retries"] == 1
        stub_info = next(w for w in info["workers"] if w["url"] == served.url)
        assert stub_info["load"] == 0 and not stub_info["healthy"]
    finally:
        rt.stop()
        served.stop()


def test_killed_worker_is_removed_and_its_request_retried(router, workers):
    """Last: it kills a worker. A second router, with no health checks to notice first,
    sends a request to the dead worker (the policy's choice: its prefix) and retries it on
    the other; the first router's health checks remove the dead worker too."""
    solo = RouterProcess("--worker-urls", *[w.url for w in workers],
                         "--health-check-interval", "600")
    try:
        system = "You are a librarian; name the shelf of every book you mention. " * 3
        before = routed(solo)
        generate(solo.url, system + "First question?")
        owner_url = next(u for u, n in routed(solo).items() if n > before[u])
        victim = next(w for w in workers if w.url == owner_url)
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(30)
        out = generate(solo.url, system + "Second question?")
        assert out["meta_info"]["completion_tokens"] == 8
        info = requests.get(solo.url + "/get_server_info", timeout=30).json()
        assert [w["url"] for w in info["workers"]] == [w.url for w in workers if w is not victim]
        assert info["removed_workers"][0]["url"] == owner_url and info["retries"] == 1
        # Streams too, and the router stays healthy with one worker.
        body = {"text": system + "Third?", "sampling_params": GREEDY, "stream": True}
        with requests.post(solo.url + "/generate", json=body, stream=True, timeout=120) as r:
            assert [line for line in r.iter_lines() if line][-1] == b"data: [DONE]"
        assert requests.get(solo.url + "/health", timeout=30).status_code == 200
    finally:
        assert solo.stop() == 0
    deadline = time.monotonic() + 30
    while owner_url in workers_info(router):  # 2 failed checks, 0.5 s apart
        assert time.monotonic() < deadline, "the health checks did not remove the dead worker"
        time.sleep(0.2)
    assert generate(router.url, system + "Fourth?")["meta_info"]["completion_tokens"] == 8


@pytest.mark.parametrize("flags, message", [
    ((), "--worker-urls needs one or more"),
    (("--worker-urls", "localhost:1"), "not an http:// or https:// URL"),
    (("--worker-urls", "http://a:1", "http://a:1/"), "more than once"),
    (("--worker-urls", "http://a:1", "--cache-threshold", "2"), "--cache-threshold"),
    (("--worker-urls", "http://a:1", "--policy", "random"), "--policy"),
    (("--worker-urls", "http://a:1", "--health-check-interval", "0"),
     "--health-check-interval"),
])
def test_bad_router_flags_are_startup_errors(flags, message):
    proc = subprocess.run([sys.executable, "-m", "radixflow.runtime.cli", "router", *flags],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_unreachable_workers_fail_startup():
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "radixflow.runtime.cli", "router", "--worker-urls",
         f"http://127.0.0.1:{port}", "--worker-startup-timeout", "1", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"http://127.0.0.1:{port}" in proc.stderr and "--worker-startup-timeout" in proc.stderr
