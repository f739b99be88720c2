"""Answering a submitted request group: one JSON body once every request finished, or an
SSE stream; either way the group is released (its unfinished requests aborted) at the end,
and a client that hangs up gets its requests aborted at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..errors import rejection
from ..response_builder import ResponseBuilder, raise_if_rejected
from .disconnect import CLIENT_CLOSED, ClientGone, until_disconnect
from .responses import OrjsonResponse
from .scheduler_client import RequestGroup, SchedulerClient


async def respond(client: SchedulerClient, group: RequestGroup, builders: list[ResponseBuilder],
                  request: Request, *, stream: AsyncIterator[bytes] | None,
                  result: Callable[[list[ResponseBuilder]], Any]) -> Response:
    """SSE from `stream` when given, else the JSON of `result(builders)` once every request
    finished. Raises the error of a request the scheduler refused."""
    if stream is not None:
        return await _open_stream(client, group, request, stream)
    try:
        await until_disconnect(collect(group, builders), request)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        client.release(group)
    raise_if_rejected(builders)
    return OrjsonResponse(result(builders))


async def collect(group: RequestGroup, builders: list[ResponseBuilder]) -> None:
    """Feed every output of `group` to its builder until all requests finished."""
    while not group.done:
        for index, out in await group.next():
            builders[index].add(out)


async def _open_stream(client: SchedulerClient, group: RequestGroup, request: Request,
                       content: AsyncIterator[bytes]) -> Response:
    """The SSE response for `group`, once its first outputs are in.

    Status 200 cannot be taken back once sent, so a request the scheduler rejects at once
    (an invalid grammar) still gets its 400 here rather than an aborted stream.
    """
    try:
        first = await until_disconnect(group.peek(), request)
        for _, out in first:
            finish = out.token.finish
            error = rejection(finish.to_json() if finish is not None else None)
            if error is not None:
                raise error
    except ClientGone:
        client.release(group)
        return Response(status_code=CLIENT_CLOSED)
    except BaseException:
        client.release(group)
        raise
    return _GroupStreamingResponse(content, client, group)


class _GroupStreamingResponse(StreamingResponse):
    """A stream that releases (aborts) its request group however the response ends."""

    def __init__(self, content: AsyncIterator[bytes], client: SchedulerClient, group: RequestGroup):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.client, self.group = client, group

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.client.release(self.group)
