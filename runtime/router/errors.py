"""The router's own error answers (a worker's errors are relayed as the worker wrote them)."""

from __future__ import annotations

from starlette.responses import Response

from ..server.responses import OrjsonResponse, sse


def router_error(status: int, message: str) -> Response:
    return OrjsonResponse({"object": "error", "message": message, "type": "router_error",
                           "code": status}, status_code=status)


def stream_error(message: str) -> bytes:
    """The event that ends a relayed stream whose worker failed mid-way."""
    return sse({"error": {"message": message, "type": "router_error", "code": 502}})
