"""The router's keys: the server's ApiKeyMiddleware (--api-key, the clients' key, on every
route but /health) with --admin-api-key for the routes that manage the workers."""

from __future__ import annotations

import hmac

from starlette.responses import Response
from starlette.types import ASGIApp

from ..server.auth import ApiKeyMiddleware, bearer
from .errors import router_error

# Routes that change the set of workers or act on all of them: --admin-api-key only.
ADMIN_PATHS = frozenset({"/add_worker", "/remove_worker", "/flush_cache"})


def is_admin_path(path: str) -> bool:
    return path.rstrip("/") in ADMIN_PATHS or "/" + path.lstrip("/") in ADMIN_PATHS


class RouterAuthMiddleware(ApiKeyMiddleware):
    """/health is open; ADMIN_PATHS need `Authorization: Bearer <--admin-api-key>` (403 when
    none is set); the rest `Bearer <--api-key>` when one is set."""

    def __init__(self, app: ASGIApp, api_key: str | None, admin_api_key: str | None):
        super().__init__(app, api_key, refuse=router_error)
        self.admin = bearer(admin_api_key)

    def refusal(self, path: str, given: bytes) -> Response | None:
        if not is_admin_path(path):
            return super().refusal(path, given)
        if self.admin is None:
            return router_error(403, f"{path} is disabled: start the router with "
                                     "--admin-api-key KEY and send 'Authorization: Bearer "
                                     "KEY' to manage its workers")
        if not hmac.compare_digest(given, self.admin):
            return router_error(401, f"{path} needs the router's admin key: send the header "
                                     "'Authorization: Bearer <--admin-api-key>'")
        return None
