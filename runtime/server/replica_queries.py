"""A question the HTTP process asks every scheduler replica (flush the cache, show the cache),
answered once each replica has answered."""

from __future__ import annotations

import asyncio
from typing import Any


class ReplicaQueries:
    def __init__(self, num_replicas: int):
        self.num_replicas = num_replicas
        self._pending: dict[str, tuple[asyncio.Future[list], list]] = {}

    async def ask(self, socks: list[Any], msg: Any, key: str, timeout: float) -> list:
        """Send `msg` to every replica; their answers (in arrival order) under `key`."""
        if key in self._pending:
            raise RuntimeError(f"a query {key!r} is already waiting for its answers")
        fut: asyncio.Future[list] = asyncio.get_running_loop().create_future()
        self._pending[key] = (fut, [])
        try:
            for sock in socks:
                sock.send(msg)
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(key, None)

    def answer(self, key: str, value: Any) -> None:
        """One replica's answer; an answer nobody waits for (timed out) is dropped."""
        entry = self._pending.get(key)
        if entry is None:
            return
        fut, answers = entry
        answers.append(value)
        if len(answers) >= self.num_replicas and not fut.done():
            fut.set_result(answers)

    def fail(self, exc: BaseException) -> None:
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
