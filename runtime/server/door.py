"""Limits at the door: what a request may send before any route sees it.

- `DoorMiddleware` (ASGI): a request a browser marks cross-site (`Sec-Fetch-Site`) is a 403;
  a body sent with a Content-Type other than JSON, or none, is a 415 (a web page cannot POST
  `text/plain` JSON cross-site); a body over --max-request-bytes is a 413,
  at once when Content-Length says so, else as soon as a chunked body passes the limit
  (counted while it streams in, never buffered past the limit).
- `door_protocol` (uvicorn's HTTP protocol, subclassed): a connection that has not sent a
  request's headers within --http-header-timeout seconds is closed (slowloris), and a
  connection past --max-connections open ones is answered a 503 with Retry-After and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .responses import error_body, error_response

RETRY_AFTER_S = 1
# A refused connection is read (and its bytes dropped) this long at most before it is closed,
# so that a client still sending its request receives the 503 rather than a reset.
REFUSED_LINGER_S = 1.0


def is_json(content_type: str) -> bool:
    """`application/json` (any parameters, such as charset) or `application/<x>+json`."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


class DoorMiddleware:
    """403 cross-site; for a request with a body, whatever its method (GET /open_session
    reads one too): 415 unless JSON, 413 over `max_request_bytes` (see the module)."""

    def __init__(self, app: ASGIApp, max_request_bytes: int):
        self.app = app
        self.max_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if headers.get(b"sec-fetch-site") == b"cross-site":
            # A browser says another site's page sent this (a form, an <img>, a fetch()): no
            # route here is meant for that, and GET routes such as /flush_cache have effects.
            response = error_response(
                403, "cross-site requests are refused: a web page of another site cannot use "
                     "this server (call it from your own code or a same-site page)",
                code="cross_site_request")
            return await response(scope, receive, send)
        length_header = headers.get(b"content-length")
        try:
            length = int(length_header) if length_header is not None else None
        except ValueError:
            length = None
        chunked = b"transfer-encoding" in headers
        if not chunked and not length:
            return await self.app(scope, receive, send)  # no body (POST /flush_cache)
        content_type = headers.get(b"content-type")
        # No Content-Type is refused too: a page's fetch() of a typeless Blob sends none, and
        # needs no CORS preflight.
        if content_type is None or not is_json(content_type.decode("latin-1")):
            shown = (repr(content_type.decode("latin-1").split(";", 1)[0].strip()[:100])
                     if content_type is not None else "(none)")
            response = error_response(
                415, f"unsupported Content-Type {shown}: send the body as application/json "
                     "(header 'Content-Type: application/json')",
                code="unsupported_media_type")
            return await response(scope, receive, send)
        if length is not None and length > self.max_bytes:
            return await self._too_large(scope, receive, send)
        # Read the body here, counting, so a chunked one is refused as soon as it is too big.
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send)
            if chunk:
                parts.append(chunk)
            if not message.get("more_body", False):
                break
        body: bytes | None = b"".join(parts)

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = {"type": "http.request", "body": body, "more_body": False}, None
                return message
            return await receive()

        return await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413, f"the request body is larger than {self.max_bytes} bytes "
                 "(the limit is set by --max-request-bytes)",
            code="request_too_large")
        await response(scope, receive, send)


def _refusal_bytes(max_connections: int) -> bytes:
    body = orjson.dumps(error_body(
        503, f"the server has {max_connections} connections open, its limit "
             f"(--max-connections); retry in {RETRY_AFTER_S} s", code="too_many_connections"))
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: {RETRY_AFTER_S}\r\n"
            f"connection: close\r\n\r\n")
    return head.encode("latin-1") + body


class _DoorMixin:
    """Header deadline and connection cap over a uvicorn HTTP protocol class (h11 or
    httptools: both keep `connections`, `cycle`, `transport` and `loop`)."""

    door_header_timeout: float = 10.0
    door_max_connections: int = 2048

    connections: set
    cycle: Any
    transport: Any
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._door_timer: asyncio.TimerHandle | None = None
        self._door_refused = False
        if len(self.connections) > self.door_max_connections:
            self._door_refuse()
            return
        self._door_arm()  # the first request's headers are due

    def _door_refuse(self) -> None:
        self._door_refused = True
        self.connections.discard(self)  # not counted, nor shut down by uvicorn: it closes itself
        transport = self.transport
        transport.write(_refusal_bytes(self.door_max_connections))
        with contextlib.suppress(NotImplementedError, AttributeError, RuntimeError, OSError):
            transport.write_eof()
        self._door_timer = self.loop.call_later(REFUSED_LINGER_S, self._door_close)

    def _door_between_requests(self) -> bool:
        cycle = self.cycle
        return cycle is None or bool(getattr(cycle, "response_complete", False))

    def _door_arm(self) -> None:
        if self._door_timer is None:
            self._door_timer = self.loop.call_later(self.door_header_timeout, self._door_close)

    def _door_disarm(self) -> None:
        if self._door_timer is not None:
            self._door_timer.cancel()
            self._door_timer = None

    def _door_close(self) -> None:
        self._door_timer = None
        idle = self._door_refused or self._door_between_requests()
        if idle and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._door_refused:
            return  # dropped: the 503 is sent, the connection closes soon
        if self._door_between_requests():
            self._door_arm()  # bytes of a new request: its headers are due in time
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not before and self.cycle is not None:
            self._door_disarm()  # a request's headers are complete

    def on_response_complete(self) -> None:
        before = self.cycle
        super().on_response_complete()  # type: ignore[misc]
        if self.cycle is before and not self.transport.is_closing():
            # A pipelined request's partial headers already buffered: they are due too.
            conn = getattr(self, "conn", None)
            trailing = getattr(conn, "trailing_data", (b"",))[0]
            if trailing:
                self._door_arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._door_disarm()
        super().connection_lost(exc)  # type: ignore[misc]


def base_protocol() -> type:
    """The HTTP protocol class uvicorn's "auto" picks: httptools when installed, else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def door_protocol(*, header_timeout: float, max_connections: int) -> type:
    """A uvicorn HTTP protocol class with these limits, for `uvicorn.Config(http=...)`."""
    base = base_protocol()
    return type(f"Door{base.__name__}", (_DoorMixin, base),
                {"door_header_timeout": float(header_timeout),
                 "door_max_connections": int(max_connections)})
