"""The scheduler process: ZMQ around `Scheduler.step`. Nothing here knows about the model."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
import zmq

from .. import host_memory
from ..errors import InvariantBroken
from ..ipc import PullSocket, PushSocket
from ..messages import CacheSnapshot, ProcessFailed, SessionsClosed
from ..server_args import ServerArgs
from .scheduler import Scheduler

logger = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
STATS_INTERVAL_MS = int(STATS_INTERVAL_S * 1000)
# The exit code of a scheduler whose invariant broke (an uncaught exception exits with 1).
INVARIANT_EXIT_CODE = 3


def run_scheduler(args: ServerArgs, in_addr: str, out_addr: str, ready: Any, *,
                  dp_rank: int = 0) -> None:
    """PULL requests on in_addr, PUSH outputs to out_addr. `ready` is a multiprocessing
    Connection: it receives {"ok": True, "model_info": {...}} or {"ok": False, "error": ...}.
    `dp_rank`: which of the --dp-size replicas this is (its device; its stats say so)."""
    try:
        if args.dp_size > 1:
            from ..server.data_parallel import replica_args

            args = replica_args(args, dp_rank)
        sched = Scheduler.from_args(args)
        sched.use_device_here()
        sched.grammars.prebuild()  # (while the server finishes starting)
    except Exception as exc:
        logger.exception("scheduler failed to start")
        ready.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    ctx = zmq.Context()
    inbox = PullSocket(ctx, in_addr)
    outbox = PushSocket(ctx, out_addr)
    ready.send({"ok": True, "model_info": sched.model_info()})
    last_stats = 0.0
    checked = False
    try:
        while True:
            # When idle, wait for work, but no longer than the stats interval.
            msgs = inbox.recv_batch(STATS_INTERVAL_MS if sched.is_idle else 0)
            for out in sched.step(msgs):
                if dp_rank and isinstance(out, SessionsClosed | CacheSnapshot):
                    out = msgspec.structs.replace(out, dp_rank=dp_rank)
                outbox.send(out)
            now = time.monotonic()
            if now - last_stats > STATS_INTERVAL_S:
                stats = sched.stats_message()
                outbox.send(msgspec.structs.replace(stats, dp_rank=dp_rank) if dp_rank else stats)
                last_stats = now
            if msgs or not sched.is_idle:
                checked = False
            elif not checked:
                # NOTE: once per idle spell, after a poll interval with nothing to do: the full
                # check walks the whole tree, too long a pause between back-to-back requests.
                sched.check_slots()
                host_memory.release_freed()  # what the work freed, kept by glibc otherwise
                checked = True
    except InvariantBroken as exc:
        # scheduler/failures.py catches what one request (or one batch) caused; this is not that
        logger.error("the scheduler stops: an invariant is broken: %s", exc, exc_info=exc)
        outbox.send(ProcessFailed(process="scheduler",
                                  message=f"an invariant is broken: {exc}"))
        raise SystemExit(INVARIANT_EXIT_CODE) from exc
    except Exception as exc:
        logger.exception("scheduler loop failed")
        outbox.send(ProcessFailed(process="scheduler", message=f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        sched.shutdown()
        inbox.close()
        outbox.close(linger_ms=1000)
        ctx.term()

