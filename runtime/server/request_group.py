"""RequestGroup: the requests one HTTP call waits for, and their outputs not taken yet.

SchedulerClient routes each output from the detokenizer to its request's group; the route
handler takes them (`next`), coalesced one per request so a slow reader costs one item per
request, not one per scheduler step.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import RadixflowError
from ..messages import GenerateReq, ReqTextOut, ReqTokenOut

if TYPE_CHECKING:
    from .scheduler_client import SchedulerClient


def _delta_bytes(token: ReqTokenOut) -> int:
    """About what an output's token deltas take in memory and on the wire: an id, a logprob,
    each top-logprob pair (prompt logprobs come once, with the first output)."""
    size = 8 * len(token.new_ids)
    if token.output_logprobs is not None:
        size += 8 * len(token.output_logprobs)
    if token.output_top_logprobs is not None:
        size += 16 * sum(len(top or ()) for top in token.output_top_logprobs)
    return size


def _merge(first: ReqTextOut, then: ReqTextOut) -> ReqTextOut:
    """One output for two successive ones of a request: the text, counts and finish of the
    later, the deltas (token ids, their logprobs) joined, prompt logprobs from either."""
    old, new = first.token, then.token
    joined: dict[str, Any] = {"new_ids": old.new_ids + new.new_ids}
    for name in ("output_logprobs", "output_top_logprobs"):
        a, b = getattr(old, name), getattr(new, name)
        if a is not None:
            joined[name] = a if b is None else a + b
    for name in ("input_logprobs", "input_ids", "input_top_logprobs"):
        if getattr(new, name) is None and getattr(old, name) is not None:
            joined[name] = getattr(old, name)
    return ReqTextOut(token=msgspec.structs.replace(new, **joined), text=then.text)


class RequestGroup:
    """Requests answered together (a batch, or n samples); their outputs wait in one place.

    Use as `async with client.submit(reqs) as group:`; leaving the block aborts whatever has
    not finished (client gone, error), so the scheduler frees its KV at once.

    Outputs a consumer has not taken yet are coalesced, one per request (cumulative text, the
    token deltas joined), so a slow client costs one item per request, not one per step; what
    the group has waiting (text, token ids, logprobs: `waiting_bytes`, an estimate) is bounded
    by the client's `max_stream_buffer_bytes` (SchedulerClient aborts the group past it).
    """

    def __init__(self, client: SchedulerClient, reqs: list[GenerateReq]):
        self.client = client
        self.reqs = reqs
        self.unfinished = {r.rid for r in reqs}
        self._pending: dict[int, ReqTextOut] = {}  # index in reqs -> its outputs not taken
        self._taken_chars: dict[int, int] = {}  # index -> length of the text last taken
        self.waiting_bytes = 0  # an estimate of what _pending holds beyond what was taken
        self._error: RadixflowError | None = None
        self._wakeup = asyncio.Event()
        self._held: list[tuple[int, ReqTextOut]] = []

    @property
    def done(self) -> bool:
        return not self.unfinished

    def put(self, index: int, out: ReqTextOut) -> int:
        """Add an output of reqs[index]; the bytes the group now has waiting (an estimate)."""
        if self._error is not None:
            return self.waiting_bytes  # failed: nothing more is kept
        pending = self._pending.get(index)
        before = len(pending.text) if pending is not None else self._taken_chars.get(index, 0)
        self._pending[index] = out if pending is None else _merge(pending, out)
        self.waiting_bytes += max(0, len(out.text) - before) + _delta_bytes(out.token)
        self._wakeup.set()
        return self.waiting_bytes

    def fail(self, error: RadixflowError) -> None:
        """The next take raises `error`; outputs not yet taken are dropped."""
        if self._error is None:
            self._error = error
        self._pending, self._held, self.waiting_bytes = {}, [], 0
        self._wakeup.set()

    async def _take(self) -> list[tuple[int, ReqTextOut]]:
        while not self._held and not self._pending and self._error is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._error is not None:
            raise self._error
        items, self._held = self._held, []
        for index, out in self._pending.items():
            self._taken_chars[index] = len(out.text)
            items.append((index, out))
        self._pending, self.waiting_bytes = {}, 0
        return items

    async def peek(self) -> list[tuple[int, ReqTextOut]]:
        """Wait for the first outputs without consuming them: `next` returns them again."""
        self._held = await self._take()
        return self._held

    async def next(self) -> list[tuple[int, ReqTextOut]]:
        """Every output that has arrived (at least one), as (index in reqs, output)."""
        items = await self._take()
        for _, out in items:
            if out.token.finish is not None:
                self.unfinished.discard(out.token.rid)
        return items

    async def __aenter__(self) -> RequestGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.client.release(self)


@dataclass(eq=False)
class RequestState:
    """One request of a group, as SchedulerClient follows it until it finishes."""

    req: GenerateReq
    index: int  # in group.reqs
    group: RequestGroup
    replica: int = 0  # the scheduler replica (--dp-size) that runs it
    created: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
