"""The scheduler process: ZMQ around `Scheduler.step`. Nothing here knows about the model."""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from ..messages import ProcessFailed, decode, encode
from ..server_args import ServerArgs
from .scheduler import Scheduler

logger = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5


def run_scheduler(args: ServerArgs, in_addr: str, out_addr: str, ready: Any) -> None:
    """PULL requests on in_addr, PUSH outputs to out_addr. `ready` is a multiprocessing
    Connection: it receives {"ok": True, "model_info": {...}} or {"ok": False, "error": ...}."""
    try:
        sched = Scheduler(args)
    except Exception as exc:
        logger.exception("scheduler failed to start")
        ready.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(in_addr)
    outbox = ctx.socket(zmq.PUSH)
    outbox.connect(out_addr)
    ready.send({"ok": True, "model_info": sched.model_info()})
    last_stats = 0.0
    checked = False
    try:
        while True:
            msgs = _drain(inbox, block=sched.is_idle)
            for out in sched.step(msgs):
                outbox.send(encode(out), copy=False)
            now = time.monotonic()
            if now - last_stats > STATS_INTERVAL_S:
                outbox.send(encode(sched.stats_message()))
                last_stats = now
            if msgs or not sched.is_idle:
                checked = False
            elif not checked:
                # NOTE: once per idle spell, after a poll interval with nothing to do: the full
                # check walks the whole tree, and between back-to-back requests it adds tens of ms.
                sched.check_slots()
                checked = True
    except Exception as exc:
        logger.exception("scheduler loop failed")
        outbox.send(encode(ProcessFailed(process="scheduler", message=f"{type(exc).__name__}: {exc}")))
        raise
    finally:
        inbox.close(linger=0)
        outbox.close(linger=1000)
        ctx.term()


def _drain(sock: zmq.Socket, block: bool) -> list:
    """Every waiting message; when idle, wait up to the stats interval for the first one."""
    msgs = []
    if block and sock.poll(timeout=int(STATS_INTERVAL_S * 1000)):
        msgs.append(decode(sock.recv(copy=False).bytes))
    while True:
        try:
            msgs.append(decode(sock.recv(flags=zmq.NOBLOCK, copy=False).bytes))
        except zmq.Again:
            return msgs
