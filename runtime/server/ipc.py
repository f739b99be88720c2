"""ZMQ plumbing shared by the server's processes: addresses and typed PUSH/PULL sockets.

Convention: the receiving end of each link binds, senders connect.

    TokenizerManager --PUSH--> scheduler_addr (Scheduler PULL binds)
    TokenizerManager --PUSH--> detokenizer_addr (GenerateReq/AbortReq: stop strings, cleanup)
    Scheduler        --PUSH--> detokenizer_addr (Detokenizer PULL binds)
    Detokenizer      --PUSH--> tokenizer_addr   (TokenizerManager PULL binds)

Only `messages.decode` ever turns received bytes into objects: nothing is unpickled.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import zmq

from .. import messages
from ..messages import Message


@dataclass(frozen=True)
class IpcAddrs:
    scheduler: str
    detokenizer: str
    tokenizer: str
    folder: str

    @classmethod
    def create(cls) -> IpcAddrs:
        # NOTE: ipc:// paths are limited to ~100 bytes, so keep them short.
        folder = tempfile.mkdtemp(prefix="rf-")
        os.chmod(folder, 0o700)
        return cls(scheduler=f"ipc://{folder}/s", detokenizer=f"ipc://{folder}/d",
                   tokenizer=f"ipc://{folder}/t", folder=folder)

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _socket(ctx: zmq.Context, kind: int, addr: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if bind:
        sock.bind(addr)
    else:
        sock.connect(addr)
    return sock


class PushSocket:
    def __init__(self, ctx: zmq.Context, addr: str, *, bind: bool = False):
        self.sock = _socket(ctx, zmq.PUSH, addr, bind)

    def send(self, msg: Message) -> None:
        self.sock.send(messages.encode(msg), copy=False)

    def close(self) -> None:
        self.sock.close()


class PullSocket:
    def __init__(self, ctx: zmq.Context, addr: str, *, bind: bool = True):
        self.sock = _socket(ctx, zmq.PULL, addr, bind)

    def recv(self, timeout_ms: int | None = None) -> Message | None:
        """The next message, or None when nothing came within timeout_ms (None: wait forever)."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms):
            return None
        return messages.decode(self.sock.recv(copy=False).bytes)

    def drain(self) -> list[Message]:
        out: list[Message] = []
        while True:
            try:
                data = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            out.append(messages.decode(data.bytes))

    def close(self) -> None:
        self.sock.close()
