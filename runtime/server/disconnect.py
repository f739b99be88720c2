"""A client that hangs up before its answer is ready: the work it waited for is cancelled.

The server's routes (respond.py, native_routes.py) and `radixflow router` use it alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from fastapi import Request
from starlette.types import Receive

CLIENT_CLOSED = 499  # nginx's status for a client that closed the connection first


class ClientGone(Exception):
    pass


async def until_disconnect(work: Awaitable[Any], request: Request) -> Any:
    """Await `work`; if the client hangs up first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


async def wait_disconnect(receive: Receive) -> None:
    """Return once the ASGI connection says the client is gone."""
    while (await receive())["type"] != "http.disconnect":
        pass
