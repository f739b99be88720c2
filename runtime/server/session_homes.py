"""Which scheduler replica each open session lives on (its history is there), and the opens
waiting for their answer."""

from __future__ import annotations

import asyncio
from typing import Any

from ..messages import OpenSessionDone, OpenSessionReq


class SessionHomes:
    def __init__(self) -> None:
        self.home: dict[str, int] = {}
        self._waiters: dict[str, asyncio.Future[OpenSessionDone]] = {}

    def replica(self, session_id: str) -> int:
        """The session's replica (unknown ids: 0, whose scheduler says there is no such)."""
        return self.home.get(session_id, 0)

    async def open(self, msg: OpenSessionReq, socks: list[Any], loads: Any,
                   timeout: float) -> OpenSessionDone:
        if msg.session_id in self._waiters:
            return OpenSessionDone(session_id=msg.session_id, success=False,
                                   message=f"session {msg.session_id!r} is being opened")
        fut: asyncio.Future[OpenSessionDone] = asyncio.get_running_loop().create_future()
        self._waiters[msg.session_id] = fut
        replica = self._place(msg.session_id, len(socks), loads)
        try:
            socks[replica].send(msg)
            done = await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters.pop(msg.session_id, None)
        if done.success:
            self.home[msg.session_id] = replica
        return done

    def _place(self, session_id: str, num_replicas: int, loads: Any) -> int:
        """The replica a session opens on: its old one (an id taken there stays refused), else
        the one with the fewest sessions, then the fewest requests in flight."""
        if session_id in self.home:
            return self.home[session_id]
        counts = [0] * num_replicas
        for replica in self.home.values():
            counts[replica] += 1
        return min(range(num_replicas), key=lambda r: (counts[r], loads[r], r))

    def close(self, session_id: str) -> int:
        """Forget the session: the replica to send its close to."""
        return self.home.pop(session_id, 0)

    def answer(self, done: OpenSessionDone) -> None:
        fut = self._waiters.get(done.session_id)
        if fut is not None and not fut.done():
            fut.set_result(done)

    def closed(self, session_ids: list[str], dp_rank: int) -> None:
        """Sessions replica `dp_rank` closed on its own (their timeout passed)."""
        for sid in session_ids:
            if self.home.get(sid) == dp_rank:
                del self.home[sid]

    def fail(self, exc: BaseException) -> None:
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(exc)
        self._waiters.clear()
