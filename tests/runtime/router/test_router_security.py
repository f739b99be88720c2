"""`radixflow router`'s keys: who may manage its workers, and what reaches a worker.

/add_worker, /remove_worker and /flush_cache need --admin-api-key (refused outright when none
is set), so nobody can register a worker of their own and receive the clients' prompts; a
client's Authorization, Cookie and Proxy-Authorization headers never reach a worker, which
sees the router's --worker-api-key instead (health checks included); a worker started with
--api-key K serves behind a router with --worker-api-key K. The workers here are stubs that
record the headers they receive, but for the last test.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests
from fastapi import FastAPI, Request
from helpers.http_stub import ServedApp
from helpers.live_server import RouterProcess as Router
from starlette.responses import JSONResponse, Response

from radixflow.runtime.router.args import RouterArgs, check_worker_url
from radixflow.runtime.server.process import ServerProcess, free_port

ADMIN = "admin-secret"
CLIENT = "client-secret"
WORKER = "worker-secret"


class StubWorker:
    """A worker that records the headers of every request and answers /generate."""

    def __init__(self):
        self.seen: list[tuple[str, dict[str, str]]] = []
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def anything(path: str, request: Request) -> Response:
            self.seen.append(("/" + path, {k.lower(): v for k, v in request.headers.items()}))
            if path == "health":
                return Response(status_code=200)
            if path == "generate":
                return JSONResponse({"text": "hi", "meta_info": {"completion_tokens": 1}})
            if path == "flush_cache":
                return Response("flushed", media_type="text/plain")
            return JSONResponse({"model_path": "stub"})

        self.served = ServedApp(app)
        self.url = self.served.url

    def headers_of(self, path: str) -> list[dict[str, str]]:
        return [h for p, h in self.seen if p == path]

    def stop(self) -> None:
        self.served.stop()


@pytest.fixture(scope="module")
def stubs():
    started = [StubWorker(), StubWorker()]
    yield started
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def keyed_router(stubs):
    rt = Router("--worker-urls", stubs[0].url, "--admin-api-key", ADMIN, "--api-key", CLIENT,
                "--worker-api-key", WORKER, "--health-check-interval", "0.3")
    yield rt
    assert rt.stop() == 0


@pytest.fixture(scope="module")
def open_stub():
    stub = StubWorker()
    yield stub
    stub.stop()


@pytest.fixture(scope="module")
def open_router(open_stub):
    """No key at all: the management routes are refused outright."""
    rt = Router("--worker-urls", open_stub.url, "--health-check-interval", "60")
    yield rt
    assert rt.stop() == 0


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def urls(router, key=CLIENT) -> list[str]:
    return requests.get(router.url + "/list_workers", headers=bearer(key), timeout=30).json()[
        "urls"]


@pytest.mark.parametrize("path", ["/add_worker", "/remove_worker", "/flush_cache"])
def test_management_is_refused_without_an_admin_key_configured(open_router, open_stub, stubs,
                                                              path):
    for headers in ({}, bearer("anything"), bearer("")):
        r = requests.post(open_router.url + path, params={"url": stubs[1].url}, headers=headers,
                          timeout=30)
        assert r.status_code == 403, r.text
        assert "--admin-api-key" in r.json()["message"]
    assert urls(open_router) == [open_stub.url]
    assert not open_stub.headers_of("/flush_cache")
    # the clients' routes stay open (no --api-key)
    assert requests.post(open_router.url + "/generate", json={"text": "x"},
                         timeout=30).status_code == 200


def test_add_worker_needs_the_admin_key(keyed_router, stubs):
    target = stubs[1].url
    for headers in ({}, bearer("wrong"), bearer(CLIENT), {"Authorization": ADMIN},
                    bearer(ADMIN + "x")):
        r = requests.post(keyed_router.url + "/add_worker", params={"url": target},
                          headers=headers, timeout=30)
        assert r.status_code == 401, (headers, r.text)
        assert "--admin-api-key" in r.json()["message"]
    assert urls(keyed_router) == [stubs[0].url]
    # the admin key is not a client key either
    assert requests.get(keyed_router.url + "/list_workers", headers=bearer(ADMIN),
                        timeout=30).status_code == 401
    r = requests.post(keyed_router.url + "/add_worker", params={"url": target + "/"},
                      headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 200 and r.json() == {"added": target}, r.text
    assert urls(keyed_router) == [stubs[0].url, target]
    # the added worker is polled with the router's worker key
    deadline = time.monotonic() + 20
    while not stubs[1].headers_of("/health"):
        assert time.monotonic() < deadline, "the added worker was never health-checked"
        time.sleep(0.1)
    assert stubs[1].headers_of("/health")[-1]["authorization"] == f"Bearer {WORKER}"
    r = requests.post(keyed_router.url + "/remove_worker", params={"url": target},
                      headers=bearer(CLIENT), timeout=30)
    assert r.status_code == 401
    r = requests.post(keyed_router.url + "/remove_worker", params={"url": target},
                      headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 200, r.text
    assert urls(keyed_router) == [stubs[0].url]


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "http://user:pass@127.0.0.1:1",
                                 "http://127.0.0.1:1?x=1", "http://127.0.0.1:1#f",
                                 "http://:1", "http://127.0.0.1:port", "127.0.0.1:1",
                                 "http://a\\@127.0.0.1:1"])
def test_add_worker_validates_the_url(keyed_router, url):
    r = requests.post(keyed_router.url + "/add_worker", params={"url": url},
                      headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 400, r.text
    with pytest.raises(ValueError):
        check_worker_url(url)


def test_clients_credentials_never_reach_a_worker(keyed_router, stubs):
    stub = stubs[0]
    before = len(stub.headers_of("/generate"))
    r = requests.post(keyed_router.url + "/generate", json={"text": "hello"},
                      headers={**bearer(CLIENT), "Cookie": "session=client-cookie",
                               "Proxy-Authorization": "Basic Y2xpZW50OnNlY3JldA==",
                               "X-Api-Key": "client-x-key"}, timeout=30)
    assert r.status_code == 200 and r.json()["text"] == "hi", r.text
    got = stub.headers_of("/generate")[before:]
    assert len(got) == 1
    headers = got[0]
    assert headers["authorization"] == f"Bearer {WORKER}"
    assert "cookie" not in headers and "proxy-authorization" not in headers
    assert "x-api-key" not in headers
    assert CLIENT not in str(headers) and "client" not in str(headers)
    # the clients' key is still required of the clients
    assert requests.post(keyed_router.url + "/generate", json={"text": "hello"},
                         timeout=30).status_code == 401
    # every health check and the start-up's model info carried the worker key too
    for path in ("/health", "/get_model_info"):
        assert stub.headers_of(path), path
        assert {h.get("authorization") for h in stub.headers_of(path)} == {f"Bearer {WORKER}"}


def test_flush_cache_with_the_admin_key_reaches_workers_with_the_worker_key(keyed_router,
                                                                              stubs):
    r = requests.post(keyed_router.url + "/flush_cache", headers=bearer(CLIENT), timeout=30)
    assert r.status_code == 401
    r = requests.post(keyed_router.url + "/flush_cache", headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 200, r.text
    assert stubs[0].headers_of("/flush_cache")[-1]["authorization"] == f"Bearer {WORKER}"


def test_without_a_worker_key_no_authorization_is_sent(open_router, open_stub):
    stub = open_stub
    before = len(stub.headers_of("/generate"))
    r = requests.post(open_router.url + "/generate", json={"text": "x"},
                      headers=bearer("a-client-token"), timeout=30)
    assert r.status_code == 200
    assert "authorization" not in stub.headers_of("/generate")[before]


def test_admin_key_must_differ_from_the_client_key():
    with pytest.raises(ValueError, match="--admin-api-key must differ from --api-key"):
        RouterArgs(worker_urls=["http://127.0.0.1:1"], api_key="k", admin_api_key="k")


def test_a_keyed_worker_serves_behind_a_router_with_its_key(tiny_model_dir):
    worker = ServerProcess(str(tiny_model_dir), max_total_tokens=1024, api_key=WORKER,
                           log_level="warning", start_timeout=300)
    try:
        rt = Router("--worker-urls", worker.url, "--worker-api-key", WORKER,
                    "--api-key", CLIENT, timeout=120)
        try:
            body = {"text": "Once upon a time",
                    "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                        "ignore_eos": True}}
            r = requests.post(rt.url + "/generate", json=body, headers=bearer(CLIENT),
                              timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["meta_info"]["completion_tokens"] == 4
            # the worker itself refuses the client's key
            assert requests.post(worker.url + "/generate", json=body, headers=bearer(CLIENT),
                                 timeout=60).status_code == 401
        finally:
            assert rt.stop() == 0
        # without the worker's key the router does not start, and says why
        proc = subprocess.run(
            [sys.executable, "-m", "radixflow.runtime.cli", "router", "--worker-urls",
             worker.url, "--port", str(free_port()), "--worker-startup-timeout", "30"],
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        assert "--worker-api-key" in proc.stderr and "401" in proc.stderr
    finally:
        worker.shutdown()


def test_a_model_id_cannot_walk_to_another_route(open_router, open_stub):
    """GET /v1/models/{id} is relayed with the id as one quoted segment: dots and slashes in
    it never reach a worker as a path of their own (/flush_cache here)."""
    for model_id in ("..%2Fflush_cache", "..%2F..%2Fflush_cache", "%2E%2E", "tiny"):
        r = requests.get(f"{open_router.url}/v1/models/{model_id}", timeout=30)
        assert r.status_code == 200, r.text  # the stub answers every path
    seen = [p for p, _ in open_stub.seen if p.startswith("/v1/models/")]
    assert seen[-4:] == ["/v1/models/../flush_cache", "/v1/models/../../flush_cache",
                         "/v1/models/..", "/v1/models/tiny"]
    assert not open_stub.headers_of("/flush_cache")
