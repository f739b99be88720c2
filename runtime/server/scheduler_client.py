"""SchedulerClient: the HTTP process's side of the pipeline.

Owns the tokenizer, sends GenerateReq/AbortReq/FlushCacheReq (and session opens/closes) to the
scheduler over ZMQ (and to nothing else: the line is HTTP -> scheduler -> detokenizer -> HTTP),
receives TextBatchOut (plus stats and acknowledgements) from the detokenizer and routes each
output to the request group that waits for it (request_group.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from ..balance.config import PolicyConfig
from ..balance.policy import LoadBalancer
from ..balance.prefix_tree import token_key
from ..errors import InvalidRequest, ServerBusy, ServerUnavailable, StreamBufferFull
from ..ipc import AsyncPullSocket, PushSocket
from ..messages import (
    AbortReq,
    CacheSnapshot,
    CacheSnapshotReq,
    CloseSessionReq,
    FlushCacheDone,
    FlushCacheReq,
    GenerateReq,
    OpenSessionDone,
    OpenSessionReq,
    ProcessFailed,
    ReqTextOut,
    SchedulerStats,
    SessionsClosed,
    TextBatchOut,
)
from ..model_loader.pooling import mismatch
from ..reasoning import ReasoningParser
from .data_parallel import total_stats
from .replica_queries import ReplicaQueries
from .request_group import RequestGroup, RequestState
from .session_homes import SessionHomes

logger = logging.getLogger(__name__)


def load_tokenizer(path: str) -> Any:
    """The fast tokenizer of a (resolved) model folder, or of a tokenizer folder."""
    from ..model_loader.hf_folder import load_tokenizer as load_folder_tokenizer

    return load_folder_tokenizer(Path(path))


class SchedulerClient:
    def __init__(self, tokenizer: Any, model_info: dict, *, scheduler_addr: str | list[str],
                 recv_addr: str, metrics: Any = None, policy: PolicyConfig | None = None):
        """`scheduler_addr`: one scheduler, or a list of --dp-size replicas, which `policy`
        (default: round robin) chooses between for each request."""
        self.tokenizer = tokenizer
        self.model_info = model_info
        # A prompt must fit the context and the KV pool (the scheduler would abort it).
        self.context_length: int = min(int(model_info["context_length"]),
                                       int(model_info.get("max_total_tokens") or 1 << 62))
        self.vocab_size: int = int(model_info.get("vocab_size") or len(tokenizer))
        # --reasoning-parser: separate_reasoning on /generate, reasoning_content in chat
        self.reasoning = ReasoningParser.load(model_info.get("reasoning_parser"), tokenizer)
        self.metrics = metrics
        self.ctx = zmq.asyncio.Context()
        self.recv_sock = AsyncPullSocket(self.ctx, recv_addr)
        # Plain sockets with no high-water mark: a send never blocks, so submit and abort
        # are synchronous and keep their order.
        self.send_ctx = zmq.Context()
        addrs = [scheduler_addr] if isinstance(scheduler_addr, str) else list(scheduler_addr)
        self.sched_socks = [PushSocket(self.send_ctx, a, unbounded=True) for a in addrs]
        one = len(addrs) == 1 or policy is None
        self.balancer = LoadBalancer(range(len(addrs)),
                                     PolicyConfig(method="round_robin") if one else policy)
        self.replica_stats: list[SchedulerStats | None] = [None] * len(addrs)
        self.sessions = SessionHomes()  # the replica each open session lives on
        self.states: dict[str, RequestState] = {}
        # Set from ServerArgs by create_app: requests waiting or running at most (past it a
        # 503 with Retry-After), and text a request may have waiting for its client.
        self.max_queued_requests: int = 4096
        self.max_stream_buffer_bytes: int = 4 * 1024 * 1024
        self.stats_time: float | None = None
        self.failure: str | None = None
        self.queries = ReplicaQueries(len(addrs))  # flushes and cache views
        self._flush_lock = asyncio.Lock()
        self._recv_task: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the receive loop on the running event loop."""
        self._recv_task = asyncio.get_running_loop().create_task(self._recv_loop())

    async def close(self) -> None:
        if self._recv_task is not None:
            self._recv_task.cancel()
        self.fail("the server is shutting down")
        self.ctx.destroy(linger=0)
        self.send_ctx.destroy(linger=0)

    def fail(self, message: str) -> None:
        """Mark the pipeline dead: every waiting request ends with ServerUnavailable."""
        if self.failure is None:
            self.failure = message
        error = ServerUnavailable(self.failure)
        for state in self.states.values():
            state.group.fail(error)
        self.states.clear()
        self.sessions.fail(ServerUnavailable(message))
        self.queries.fail(ServerUnavailable(message))

    @property
    def is_healthy(self) -> bool:
        return self.failure is None

    @property
    def stats(self) -> SchedulerStats | None:
        """The scheduler's last stats (the replicas' summed under --dp-size)."""
        return total_stats(self.replica_stats)

    # -- requests --------------------------------------------------------------------------

    def submit(self, reqs: list[GenerateReq]) -> RequestGroup:
        if self.failure is not None:
            raise ServerUnavailable(self.failure)
        embedding_server = self.model_info.get("embedding") is not None
        for req in reqs:
            why = mismatch(req.embed is not None, embedding_server)  # (--is-embedding)
            if why is not None:
                raise InvalidRequest(why)
            if req.routed_dp_rank is not None and not (
                    0 <= req.routed_dp_rank < len(self.sched_socks)):
                raise InvalidRequest(f"routed_dp_rank {req.routed_dp_rank} is not a replica: "
                                     f"this server runs {len(self.sched_socks)} (--dp-size)",
                                     param="routed_dp_rank")
            if req.rid in self.states:
                raise InvalidRequest(f"a request with rid {req.rid!r} is already running",
                                     param="rid")
        if len(reqs) > self.max_queued_requests:
            raise InvalidRequest(
                f"the request asks for {len(reqs)} generations; the server holds at most "
                f"{self.max_queued_requests} at once (--max-queued-requests)")
        if len(self.states) + len(reqs) > self.max_queued_requests:
            raise ServerBusy(
                f"the server is full: {len(self.states)} requests are waiting or running, "
                f"its limit is {self.max_queued_requests} (--max-queued-requests); retry later",
                retry_after=1)
        group = RequestGroup(self, reqs)
        for i, req in enumerate(reqs):
            replica = self._replica_for(req)
            self.states[req.rid] = RequestState(req=req, index=i, group=group, replica=replica)
            self.sched_socks[replica].send(req)
        if self.metrics is not None:
            self.metrics.requests_started(len(reqs))
        return group

    def _replica_for(self, req: GenerateReq) -> int:
        session = getattr(req, "session", None)
        if req.routed_dp_rank is not None and session is None:
            self.balancer.assign(req.routed_dp_rank)
            return req.routed_dp_rank
        if len(self.sched_socks) == 1 or session is not None:
            # A session's history is on its replica (unknown ids: 0 says there is none).
            replica = 0 if session is None else self.sessions.replica(session.id)
            self.balancer.assign(replica)
            return replica
        key = token_key(req.input_ids) if self.balancer.needs_key else None
        return self.balancer.select(key)

    def abort(self, rid: str) -> None:
        state = self.states.pop(rid, None)
        if state is None or self.failure is not None:
            return
        self.balancer.done(state.replica)
        self.sched_socks[state.replica].send(AbortReq(rid=rid))
        if self.metrics is not None:
            self.metrics.request_aborted()

    def abort_request(self, rid: str) -> bool:
        """/abort_request: stop a request another connection is waiting for; its response
        ends with an abort finish. False: no request `rid` is waiting or running."""
        state = self.states.get(rid)
        if state is None or self.failure is not None:
            return False
        self.sched_socks[state.replica].send(AbortReq(rid=rid))
        return True

    def release(self, group: RequestGroup) -> None:
        for rid in list(group.unfinished):
            self.abort(rid)
        group.unfinished.clear()

    async def flush_cache(self, timeout: float = 30.0) -> bool:
        if self.failure is not None:
            raise ServerUnavailable(self.failure)
        async with self._flush_lock:  # one flush at a time: its answers are counted
            acks = await self.queries.ask(self.sched_socks, FlushCacheReq(), "flush", timeout)
        flushed = all(acks)
        if flushed:
            self.balancer.clear_cache()
        return flushed

    async def cache_snapshots(self, max_nodes: int, timeout: float = 10.0) -> list[dict]:
        """Every replica's cache view (scheduler/cache_view.py), in dp_rank order."""
        if self.failure is not None:
            raise ServerUnavailable(self.failure)
        answers = await self.queries.ask(
            self.sched_socks, CacheSnapshotReq(query_id=(qid := uuid.uuid4().hex),
                                               max_nodes=max_nodes), qid, timeout)
        return [{"dp_rank": a.dp_rank, **a.view} for a in sorted(answers,
                                                                 key=lambda a: a.dp_rank)]

    async def open_session(self, msg: OpenSessionReq, timeout: float = 30.0) -> OpenSessionDone:
        """Ask the scheduler to open the session; its answer (success False: the id is taken)."""
        if self.failure is not None:
            raise ServerUnavailable(self.failure)
        return await self.sessions.open(msg, self.sched_socks, self.balancer.load, timeout)

    def close_session(self, msg: CloseSessionReq) -> None:
        """Sent, not answered: requests sent after it find the session closed (one socket, in
        order)."""
        if self.failure is not None:
            raise ServerUnavailable(self.failure)
        self.sched_socks[self.sessions.close(msg.session_id)].send(msg)

    # -- receive loop ----------------------------------------------------------------------

    async def _recv_loop(self) -> None:
        while True:
            msg = await self.recv_sock.recv()
            try:
                self._handle(msg)
            except Exception as exc:  # a bug here would hang every request: fail them instead
                logger.exception("the HTTP process could not handle a %s", type(msg).__name__)
                self.fail(f"the HTTP process failed on a {type(msg).__name__}: "
                          f"{type(exc).__name__}: {exc}")

    def _handle(self, msg: Any) -> None:
        """One message from the detokenizer (outputs, stats, acknowledgements)."""
        if isinstance(msg, TextBatchOut):
            self._route(msg.outputs)
        elif isinstance(msg, SchedulerStats):
            if msg.dp_rank < len(self.replica_stats):
                self.replica_stats[msg.dp_rank], self.stats_time = msg, time.time()
        elif isinstance(msg, FlushCacheDone):
            self.queries.answer("flush", msg.success)
        elif isinstance(msg, CacheSnapshot):
            self.queries.answer(msg.query_id, msg)
        elif isinstance(msg, OpenSessionDone):
            self.sessions.answer(msg)
        elif isinstance(msg, SessionsClosed):  # reaped by their timeout
            self.sessions.closed(msg.session_ids, msg.dp_rank)
        elif isinstance(msg, ProcessFailed):
            logger.error("the %s process failed: %s", msg.process, msg.message)
            self.fail(f"the {msg.process} process failed: {msg.message}")
        else:
            logger.warning("unexpected message from the detokenizer: %s", type(msg).__name__)

    def _route(self, outputs: list[ReqTextOut]) -> None:
        now = time.monotonic()
        for out in outputs:
            rid = out.token.rid
            state = self.states.get(rid)
            if state is None:  # aborted or already failed
                continue
            if state.first_token_time is None and out.token.new_ids:
                state.first_token_time = now
            if out.token.finish is not None:
                del self.states[rid]
                self.balancer.done(state.replica)
                if self.metrics is not None:
                    self.metrics.request_finished(state.created, state.first_token_time, now,
                                                  out.token.completion_tokens)
            group = state.group
            waiting = group.put(state.index, out)
            if waiting > self.max_stream_buffer_bytes and any(
                    r in self.states for r in group.unfinished):  # (one still generating)
                # The client reads slower than the model writes: stop the group, free its KV.
                logger.warning("request %s aborted: ~%d bytes of output wait for its client "
                               "(--max-stream-buffer-bytes %d)", rid, waiting,
                               self.max_stream_buffer_bytes)
                for r in list(group.unfinished):  # (kept unfinished: the reader sees why)
                    self.abort(r)
                group.fail(StreamBufferFull(
                    f"the request was aborted: more than {self.max_stream_buffer_bytes} bytes of "
                    "its output waited for the client to read them (--max-stream-buffer-bytes)"))
