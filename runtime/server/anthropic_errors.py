"""Errors in Anthropic's shape, for the /v1/messages routes only:
{"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}.

`AnthropicRoute` (the router's route class) turns whatever a handler raises into that shape
with the status the server's one handler would give it; auth.py answers a missing key on
these paths the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import Response

from ..errors import RadixflowError, ServerBusy
from .responses import OrjsonResponse, validation_error

logger = logging.getLogger(__name__)

PATH_PREFIX = "/v1/messages"
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
          529: "overloaded_error"}


def is_anthropic_path(path: str) -> bool:
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def error_type(status: int, busy: bool = False) -> str:
    """Anthropic's error type for `status`; `busy`: a full server (overloaded_error)."""
    if busy:
        return "overloaded_error"
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str, *, busy: bool = False) -> dict:
    return {"type": "error", "error": {"type": error_type(status, busy), "message": message}}


def error_response(status: int, message: str, *, busy: bool = False,
                   headers: dict[str, str] | None = None) -> OrjsonResponse:
    return OrjsonResponse(error_body(status, message, busy=busy), status_code=status,
                          headers=headers)


def error_event(status: int, message: str, *, busy: bool = False) -> bytes:
    """An `error` event of a stream already under way."""
    return b"event: error\ndata: " + orjson.dumps(error_body(status, message, busy=busy)) + \
        b"\n\n"


def radixflow_error(request: Request, exc: RadixflowError) -> Response:
    status = exc.status_code
    retry_after = getattr(exc, "retry_after", None)
    if status >= 500 and retry_after is None:
        logger.error("%s %s failed: %s", request.method, request.url.path, exc)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    message, param = str(exc), getattr(exc, "param", None)
    if param and not message.startswith(param):  # Anthropic's shape has no `param`
        message = f"{param}: {message}"
    return error_response(status, message, busy=isinstance(exc, ServerBusy) and status == 503,
                          headers=headers)


class AnthropicRoute(APIRoute):
    """A route whose errors are answered in Anthropic's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RadixflowError as exc:
                return radixflow_error(request, exc)
            except RequestValidationError as exc:
                return radixflow_error(request, validation_error(exc.errors()))
            except Exception as exc:  # noqa: BLE001 -- one request's failure is a 500
                logger.exception("%s %s raised", request.method, request.url.path)
                return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

        return route
