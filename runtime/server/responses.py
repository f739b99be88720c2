"""Response bodies: JSON through orjson, OpenAI-shaped errors, server-sent events."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from ..errors import InvalidRequest


class OrjsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_body(status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape (a superset of SGLang's `{"error": {"message": ...}}`)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, *, headers: dict[str, str] | None = None,
                   **kw: Any) -> OrjsonResponse:
    return OrjsonResponse(error_body(status, message, **kw), status_code=status,
                          headers=headers)


def validation_error(errors: list[dict]) -> InvalidRequest:
    """A pydantic validation failure as one 400 naming its first bad field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    msg = str(first.get("msg")).removeprefix("Value error, ")  # a validator's own words
    message = f"{param}: {msg}" if param else msg
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return InvalidRequest(message, param=param)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
