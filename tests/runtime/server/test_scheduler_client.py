"""The HTTP process's sockets reach the scheduler replicas and nothing else: requests, aborts,
flushes and session messages go to a scheduler, never to the detokenizer (the line is HTTP ->
scheduler -> detokenizer -> HTTP). No model, no server: real ZMQ sockets on a temp folder."""

from __future__ import annotations

import asyncio
import contextlib

import zmq

from radixflow.runtime.ipc import IpcAddrs, PullSocket, PushSocket
from radixflow.runtime.messages import (
    AbortReq,
    CloseSessionReq,
    FlushCacheReq,
    GenerateReq,
    SessionParams,
)
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server.scheduler_client import SchedulerClient

MODEL_INFO = {"context_length": 64, "vocab_size": 100}
REPLICAS = 2


def push_sockets(client: SchedulerClient) -> list[PushSocket]:
    found = []
    for value in vars(client).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, PushSocket):
                found.append(item)
    return found


async def talk_to_everyone(client: SchedulerClient) -> None:
    client.start()
    reqs = [GenerateReq(rid=f"r{i}", input_ids=[1, 2, 3], sampling=SamplingParams())
            for i in range(REPLICAS)]
    group = client.submit(reqs)
    client.release(group)  # aborts both
    client.submit([GenerateReq(rid="s", input_ids=[4], sampling=SamplingParams(),
                               session=SessionParams(id="sess"))])
    client.abort("s")
    client.close_session(CloseSessionReq(session_id="sess"))
    with contextlib.suppress(TimeoutError):  # nobody answers the flush here
        await client.flush_cache(timeout=0.2)
    await client.close()


def test_the_http_process_sends_to_the_schedulers_only():
    addrs = IpcAddrs.create()
    ctx = zmq.Context()
    try:
        schedulers = [PullSocket(ctx, addr) for addr in addrs.schedulers(REPLICAS)]
        detokenizer = PullSocket(ctx, addrs.detokenizer)
        client = SchedulerClient(object(), MODEL_INFO, scheduler_addr=addrs.schedulers(REPLICAS),
                                 recv_addr=addrs.client)
        endpoints = {s.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
                     for s in push_sockets(client)}
        assert endpoints == set(addrs.schedulers(REPLICAS))

        asyncio.run(talk_to_everyone(client))

        got = [[type(m) for m in s.recv_batch(timeout_ms=2000)] for s in schedulers]
        assert all(FlushCacheReq in kinds for kinds in got)  # a flush reaches every replica
        sent = [kind for kinds in got for kind in kinds]
        assert sent.count(GenerateReq) == 3 and sent.count(AbortReq) == 3
        assert CloseSessionReq in sent
        assert detokenizer.recv_batch(timeout_ms=300) == []
    finally:
        ctx.destroy(linger=0)
        addrs.cleanup()
