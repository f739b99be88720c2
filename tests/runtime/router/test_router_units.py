"""The router's pieces without workers: routing keys and the key middleware (the server's
ApiKeyMiddleware with the router's admin key)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from radixflow.runtime.balance.prefix_tree import token_key
from radixflow.runtime.router.auth import RouterAuthMiddleware
from radixflow.runtime.router.routing_key import routing_key
from radixflow.runtime.server.auth import ApiKeyMiddleware


@pytest.mark.parametrize("path, body, key", [
    ("/generate", {"text": "hello"}, "hello"),
    ("/generate", {"text": ["first", "second"]}, "first"),
    ("/generate", {"input_ids": [1, 2, 3]}, token_key([1, 2, 3])),
    ("/generate", {"input_ids": [[5, 6], [7]]}, token_key([5, 6])),
    ("/generate", {"input_ids": [-1]}, None),
    ("/v1/completions", {"prompt": "once upon"}, "once upon"),
    ("/v1/chat/completions", {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}]},
     "<system>be brief\n<user>hi\n"),
    ("/v1/chat/completions", {"messages": "not a list"}, None),
    ("/generate", ["not", "a", "dict"], None),
    ("/v1/messages", {"system": [{"type": "text", "text": "sys"}],
                      "messages": [{"role": "user", "content": "hi"}]}, "<system>sys\n<user>hi\n"),
    ("/v1/messages", {"messages": 3}, "<system>\n"),
    ("/v1/responses", {"instructions": "be kind", "input": "hello"},
     "<system>be kind\n<user>hello\n"),
    ("/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "a"}]}, {"type": "function_call_output"}]},
     "<system>\n<user>a\n<None>\n"),
    ("/v1/embeddings", {"input": ["doc one", "doc two"]}, "doc one"),
    ("/v1/embeddings", {"input": [4, 5]}, token_key([4, 5])),
    ("/encode", {"input_ids": [9]}, token_key([9])),
])
def test_routing_key(path, body, key):
    assert routing_key(path, body) == key


def _client(middleware, **keys) -> TestClient:
    async def ok(request):
        return PlainTextResponse("ok")

    routes = [Route(p, ok, methods=["GET", "POST"])
              for p in ("/health", "/generate", "/add_worker", "/flush_cache")]
    app = Starlette(routes=routes)
    app.add_middleware(middleware, **keys)
    return TestClient(app)


def test_the_servers_key_guards_every_path_but_health():
    client = _client(ApiKeyMiddleware, api_key="k")
    assert client.get("/health").status_code == 200
    r = client.post("/generate")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer <key>" in r.json()["error"]["message"]
    assert client.post("/generate", headers={"Authorization": "Bearer k"}).text == "ok"
    assert client.post("/generate", headers={"Authorization": "Bearer x"}).status_code == 401


def test_the_routers_admin_routes_need_the_admin_key():
    client = _client(RouterAuthMiddleware, api_key="client", admin_api_key="admin")
    assert client.get("/health").status_code == 200
    r = client.post("/generate")
    assert r.status_code == 401 and r.json()["type"] == "router_error"
    assert client.post("/generate", headers={"Authorization": "Bearer client"}).text == "ok"
    for path in ("/add_worker", "/flush_cache/"):
        r = client.post(path, headers={"Authorization": "Bearer client"})
        assert r.status_code == 401 and "--admin-api-key" in r.json()["message"], path
    assert client.post("/add_worker", headers={"Authorization": "Bearer admin"}).text == "ok"


def test_without_an_admin_key_the_admin_routes_are_off():
    client = _client(RouterAuthMiddleware, api_key=None, admin_api_key=None)
    assert client.post("/generate").text == "ok"  # no client key: open
    r = client.post("/add_worker", headers={"Authorization": "Bearer anything"})
    assert r.status_code == 403 and "is disabled" in r.json()["message"]
