"""ZMQ plumbing shared by the server's processes: addresses and typed PUSH/PULL sockets.

Convention: the receiving end of each link binds, senders connect. The links make one line:

    SchedulerClient --PUSH--> scheduler_addr   (Scheduler PULL binds; one per replica)
    Scheduler       --PUSH--> detokenizer_addr (Detokenizer PULL binds; every replica)
    Detokenizer     --PUSH--> client_addr      (SchedulerClient PULL binds)

Every socket of the server is one of these wrappers, and only `messages.decode` ever turns
received bytes into objects: nothing is unpickled.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import tempfile
from dataclasses import dataclass

import zmq
import zmq.asyncio

from . import messages
from .messages import Message


@dataclass(frozen=True)
class IpcAddrs:
    scheduler: str
    detokenizer: str
    client: str
    folder: str

    @classmethod
    def create(cls) -> IpcAddrs:
        # NOTE: ipc:// paths are limited to ~100 bytes, so keep them short.
        folder = tempfile.mkdtemp(prefix="rf-")
        os.chmod(folder, 0o700)
        return cls(scheduler=f"ipc://{folder}/s", detokenizer=f"ipc://{folder}/d",
                   client=f"ipc://{folder}/c", folder=folder)

    def schedulers(self, n: int) -> list[str]:
        """The inbox of each of n scheduler replicas (--dp-size); the first is `scheduler`."""
        return [self.scheduler] + [f"{self.scheduler}{rank}" for rank in range(1, n)]

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _socket(ctx: zmq.Context, kind: int, addr: str, bind: bool, **options: int) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():  # before bind/connect: a pipe keeps its options
        sock.setsockopt(getattr(zmq, name), value)
    if bind:
        sock.bind(addr)
    else:
        sock.connect(addr)
    return sock


class PushSocket:
    """Sends messages. `unbounded`: no high-water mark, so `send` never blocks (and sends
    from one thread keep their order without awaiting anything)."""

    def __init__(self, ctx: zmq.Context, addr: str, *, bind: bool = False,
                 unbounded: bool = False):
        self.sock = _socket(ctx, zmq.PUSH, addr, bind, **({"SNDHWM": 0} if unbounded else {}))

    def send(self, msg: Message) -> None:
        self.sock.send(messages.encode(msg), copy=False)

    def close(self, linger_ms: int = 0) -> None:
        """Close; `linger_ms` lets queued messages (a last ProcessFailed) still go out."""
        self.sock.close(linger=linger_ms)


class PullSocket:
    def __init__(self, ctx: zmq.Context, addr: str, *, bind: bool = True):
        self.sock = _socket(ctx, zmq.PULL, addr, bind)

    def recv_batch(self, timeout_ms: int | None = None) -> list[Message]:
        """Every waiting message, after waiting up to `timeout_ms` for the first one
        (None: wait forever, 0: do not wait); empty when nothing came."""
        if timeout_ms != 0 and not self.sock.poll(timeout_ms):
            return []
        out: list[Message] = []
        while True:
            try:
                data = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            out.append(messages.decode(data.bytes))

    def close(self) -> None:
        self.sock.close()


class AsyncPullSocket:
    """A PULL socket for an asyncio loop (the HTTP process's receiver)."""

    def __init__(self, ctx: zmq.asyncio.Context, addr: str, *, bind: bool = True):
        self.sock = _socket(ctx, zmq.PULL, addr, bind)

    async def recv(self) -> Message:
        return messages.decode(await self.sock.recv())

    def close(self) -> None:
        self.sock.close()


class LocalInbox:
    """The in-process stand-in for a PullSocket (the Engine's scheduler thread reads it)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, msg: object) -> None:
        self._queue.put(msg)

    def recv_batch(self, timeout_ms: int | None = None) -> list:
        """As PullSocket.recv_batch."""
        out = []
        if timeout_ms != 0:
            try:
                out.append(self._queue.get(timeout=None if timeout_ms is None
                                           else timeout_ms / 1000))
            except queue.Empty:
                return out
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
