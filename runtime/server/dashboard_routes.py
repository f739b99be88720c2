"""The operator's live view: /dashboard (the page) and the JSON it polls.

The page is plain HTML, JS and CSS shipped in the package (runtime/server/dashboard/); its
three files load without the API key (a browser navigation sends no Authorization header:
auth.py lists them in OPEN_PATHS) and hold nothing of the server's. Everything it shows comes
from GET /dashboard/state, which needs the key like every other route; the page asks for it.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..errors import InvalidRequest
from .data_parallel import replica_info
from .responses import OrjsonResponse
from .state import server_state

router = APIRouter()

PAGE_DIR = Path(__file__).parent / "dashboard"
# path -> (file, media type): the page's files, served without the API key
PAGE_FILES = {
    "/dashboard": ("index.html", "text/html; charset=utf-8"),
    "/dashboard/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/dashboard/app.css": ("app.css", "text/css; charset=utf-8"),
}
DEFAULT_MAX_NODES = 256
MAX_NODES_LIMIT = 2048
STATE_PARAMS = frozenset({"max_nodes"})
# The page runs only its own script and talks only to this server; nothing may frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@functools.cache
def page_file(name: str) -> bytes:
    return (PAGE_DIR / name).read_bytes()


def _page(path: str) -> Response:
    name, media_type = PAGE_FILES[path]
    return Response(page_file(name), media_type=media_type, headers=PAGE_HEADERS)


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> Response:
    return _page("/dashboard")


@router.get("/dashboard/app.js", include_in_schema=False)
async def dashboard_js() -> Response:
    return _page("/dashboard/app.js")


@router.get("/dashboard/app.css", include_in_schema=False)
async def dashboard_css() -> Response:
    return _page("/dashboard/app.css")


def max_nodes_param(request: Request) -> int:
    """The `max_nodes` query parameter (nodes per replica): 1..MAX_NODES_LIMIT, else a 400."""
    unknown = sorted(set(request.query_params) - STATE_PARAMS)
    if unknown:
        raise InvalidRequest(f"unknown query parameter {unknown[0]!r}: /dashboard/state takes "
                             "only 'max_nodes'", param=unknown[0])
    raw = request.query_params.get("max_nodes")
    if raw is None:
        return DEFAULT_MAX_NODES
    if len(raw) > 8 or not raw.isdigit():
        raise InvalidRequest(f"max_nodes must be an integer from 1 to {MAX_NODES_LIMIT}",
                             param="max_nodes")
    value = int(raw)
    if not 1 <= value <= MAX_NODES_LIMIT:
        raise InvalidRequest(f"max_nodes must be from 1 to {MAX_NODES_LIMIT}, not {value}",
                             param="max_nodes")
    return value


@router.get("/dashboard/state")
async def dashboard_state(request: Request) -> Response:
    """Every replica's radix tree, KV pool, queues and grammar cache, its load and counters,
    and the server's throughput / TTFT / TPOT history."""
    max_nodes = max_nodes_param(request)
    state = server_state(request)
    client = state.client
    snapshots = await client.cache_snapshots(max_nodes)
    loads = {info["dp_rank"]: info for info in replica_info(client)}
    replicas = [{**snap, "stats": loads.get(snap["dp_rank"], {})} for snap in snapshots]
    metrics = state.metrics
    return OrjsonResponse({
        "time": time.time(), "model": state.served_model_name,
        "dp_size": len(client.replica_stats), "max_nodes": max_nodes,
        "replicas": replicas,
        "history": metrics.history.series() if metrics is not None else None,
    }, headers={"Cache-Control": "no-store"})
