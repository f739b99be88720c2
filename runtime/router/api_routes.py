"""The router's relays for the APIs beyond generation: Anthropic's /v1/messages, OpenAI's
/v1/responses and /v1/embeddings, SGLang's /encode, /tokenizer_info.

A stored response lives on the worker that made it, so whatever names one (GET, DELETE,
cancel and input_items of /v1/responses/{id}, and a new response's previous_response_id) goes
to the worker that holds it: the router asks every worker (GET /v1/responses/{id}, all at
once) and relays to the one that answers 200, so the continued conversation also finds its
prefix in that worker's radix cache. No worker holding it is OpenAI's 404.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import httpx
import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from ..server.responses import error_response
from .proxy import forward
from .router import Router

KEYED_POSTS = ("/v1/messages", "/v1/embeddings", "/encode")
UNKEYED_POSTS = ("/v1/messages/count_tokens",)
MAX_ID_CHARS = 128  # as the workers' previous_response_id


async def response_holder(router: Router, response_id: str) -> str | None:
    """The worker that stores response `response_id`, or None."""
    assert router.http is not None
    http, headers = router.http, router.headers()

    async def holds(url: str) -> bool:
        try:
            r = await http.get(f"{url}/v1/responses/{quote(response_id, safe='')}",
                               headers=headers)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    urls = list(router.workers)
    found = await asyncio.gather(*(holds(u) for u in urls))
    return next((u for u, ok in zip(urls, found, strict=True) if ok), None)


def not_found(response_id: str, param: str) -> Response:
    return error_response(404, f"Response with id {response_id!r} not found.", param=param)


async def to_holder(router: Router, request: Request, path: str, response_id: str, *,
                    param: str = "response_id") -> Response:
    """Relay to the worker that stores `response_id` (`path` may name {id}: it is quoted)."""
    if len(response_id) > MAX_ID_CHARS:
        return not_found(response_id[:MAX_ID_CHARS] + "...", param)
    holder = await response_holder(router, response_id)
    if holder is None:
        return not_found(response_id, param)
    path = path.format(id=quote(response_id, safe=""))
    return await forward(router, request, path, keyed=param != "response_id", worker=holder)


def add_api_routes(app: FastAPI, router: Router) -> None:
    for path in KEYED_POSTS + UNKEYED_POSTS:
        async def relay(request: Request, path: str = path) -> Response:
            return await forward(router, request, path, keyed=path in KEYED_POSTS)

        app.add_api_route(path, relay, methods=["POST"])

    @app.get("/tokenizer_info")
    async def tokenizer_info(request: Request) -> Response:
        return await forward(router, request, "/tokenizer_info", keyed=False)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            body = None  # the worker answers the 400
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if isinstance(previous, str):
            return await to_holder(router, request, "/v1/responses", previous,
                                   param="previous_response_id")
        return await forward(router, request, "/v1/responses", keyed=True)

    @app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
    async def stored_response(request: Request, response_id: str) -> Response:
        return await to_holder(router, request, "/v1/responses/{id}", response_id)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> Response:
        return await to_holder(router, request, "/v1/responses/{id}/cancel", response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(request: Request, response_id: str) -> Response:
        return await to_holder(router, request, "/v1/responses/{id}/input_items", response_id)
