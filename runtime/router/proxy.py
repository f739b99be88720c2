"""Relaying a request to a worker: retried elsewhere while no byte of an answer came back,
then passed on byte for byte (a stream as it comes)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
import orjson
from fastapi import Request
from starlette.responses import Response, StreamingResponse

from ..balance.policy import NoWorker
from ..server.disconnect import CLIENT_CLOSED, ClientGone, until_disconnect
from .errors import router_error, stream_error
from .router import Router
from .routing_key import routing_key

logger = logging.getLogger(__name__)

SSE = "text/event-stream"


async def forward(router: Router, request: Request, path: str, *, keyed: bool,
                  worker: str | None = None) -> Response:
    """Send the request to a worker (chosen by the policy when `keyed`: those count in the
    workers' loads; only `worker` when given, for state that lives on one), retrying
    elsewhere while no byte of an answer has come back; relay the answer."""
    assert router.http is not None
    body = await request.body()
    key = None
    if keyed and router.balancer.needs_key:
        try:
            key = routing_key(path, orjson.loads(body))
        except orjson.JSONDecodeError:
            key = None  # the worker answers the 400
    headers = router.headers(request)
    tried: set[str] = set()
    last_error = "no worker is available"
    while True:
        try:
            url = router.pick(key, keyed, tried, only=worker)
        except NoWorker:
            return router_error(503, f"no worker could take the request: {last_error}")
        tried.add(url)

        def release(url: str = url) -> None:
            if keyed:
                router.balancer.done(url)

        upstream = router.http.build_request(request.method, url + path, content=body,
                                             headers=headers, params=request.query_params)
        try:
            resp = await until_disconnect(router.http.send(upstream, stream=True), request)
        except ClientGone:  # the send is cancelled: the worker sees its client go
            release()
            return Response(status_code=CLIENT_CLOSED)
        except httpx.ConnectError as exc:  # nothing listens: the worker is gone
            release()
            last_error = f"{url}: {type(exc).__name__}: {exc}"
            router.remove(url, f"connection failed: {exc}")
            router.retries += 1
            continue
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            release()
            last_error = f"{url}: {type(exc).__name__}"
            router.mark_unhealthy(url)
            router.retries += 1
            continue
        except httpx.HTTPError as exc:  # sent, then failed: it may have started
            release()
            return router_error(502, f"worker {url} failed: {type(exc).__name__}: {exc}")
        if resp.status_code == 503:  # refused before it started (unhealthy, stopping)
            text = (await resp.aread()).decode(errors="replace")
            await resp.aclose()
            release()
            last_error = f"{url} answered 503: {text[:300]}"
            router.mark_unhealthy(url)
            router.retries += 1
            continue
        if resp.status_code == 401:  # the worker's key, not the client's: say so
            await resp.aread()
            await resp.aclose()
            release()
            logger.error("worker %s refused the router's --worker-api-key (401)", url)
            return router_error(502, f"worker {url} refused the router's key: the router's "
                                     "--worker-api-key must be the workers' --api-key")
        return await relay(resp, url, release)


async def relay(resp: httpx.Response, url: str, release: Callable[[], None]) -> Response:
    """The worker's answer as the client's; `release` once it is over, however it ends."""
    media_type = resp.headers.get("content-type")
    if not (media_type or "").startswith(SSE):
        try:
            content = await resp.aread()
        except httpx.HTTPError as exc:
            return router_error(502, f"worker {url} failed mid-answer: {exc}")
        finally:
            release()
            await close(resp)
        return Response(content, status_code=resp.status_code, media_type=media_type)

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            yield stream_error(f"worker {url} failed mid-stream: {exc}")
        finally:
            release()
            await close(resp)  # the client left, or the stream ended: free the worker

    return StreamingResponse(chunks(), status_code=resp.status_code, media_type=media_type)


async def close(resp: httpx.Response) -> None:
    """Close the worker's response even while our task is being cancelled (client gone):
    the closed connection is what tells the worker to abort."""
    with anyio.CancelScope(shield=True):
        await resp.aclose()
