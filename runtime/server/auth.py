"""API keys at the door: `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`),
checked before a route sees the request.

ApiKeyMiddleware is the server's (--api-key: every path but /health); `radixflow router` adds
its admin key for the management routes to it (router/auth.py), with its own error bodies.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .anthropic_errors import error_response as anthropic_error
from .anthropic_errors import is_anthropic_path
from .responses import error_response

# /dashboard's page files hold nothing of the server's; its data (/dashboard/state) needs the key
OPEN_PATHS = frozenset({"/health", "/dashboard", "/dashboard/app.js", "/dashboard/app.css"})
WRONG_KEY = ("missing or incorrect API key: send the header 'Authorization: Bearer <key>' (or "
             "'x-api-key: <key>')")

# (status, message) -> the response that refuses a request
Refusal = Callable[[int, str], Response]


def bearer_header(scope: Scope) -> bytes:
    """The request's first Authorization header; without one its x-api-key header (what the
    anthropic client sends) as `Bearer <key>`; b"" when it has neither."""
    api_key = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value
        if name == b"x-api-key" and api_key is None:
            api_key = b"Bearer " + value
    return api_key or b""


def bearer(key: str | None) -> bytes | None:
    """The Authorization header that carries `key`; None for no key."""
    return f"Bearer {key}".encode() if key else None


def invalid_api_key(status: int, message: str) -> Response:
    return error_response(status, message, code="invalid_api_key")


class ApiKeyMiddleware:
    """Every path but OPEN_PATHS needs `Authorization: Bearer <api_key>` (with a key set);
    `refusal` decides, and subclasses may ask more of some paths."""

    def __init__(self, app: ASGIApp, api_key: str | None, *,
                 refuse: Refusal = invalid_api_key):
        self.app = app
        self.expected = bearer(api_key)
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope.get("path", ""), bearer_header(scope))
        if refusal is not None:
            return await refusal(scope, receive, send)
        return await self.app(scope, receive, send)

    def refusal(self, path: str, given: bytes) -> Response | None:
        """The answer to a request whose Authorization header is `given`; None to let it in."""
        if self.expected is not None and not hmac.compare_digest(given, self.expected):
            return (anthropic_error if is_anthropic_path(path) else self.refuse)(401, WRONG_KEY)
        return None
