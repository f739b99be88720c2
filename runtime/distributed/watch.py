"""Node 0's watch over the ranks on other nodes (`radixflow serve --nnodes N`, N > 1).

Ranks on other nodes beat a counter in rank 0's store every second (parallel_state.py). A
node that dies or loses the network stops beating; while the server is busy, the next
collective fails at once, but an idle server would not notice until a request came. This
child of node 0's launcher notices within the heartbeat timeout and exits with a message,
which makes the launcher stop the server (it stops whenever a child dies).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from ..processes import fast_exit
from ..server_args import ServerArgs
from .layout import Layout, parse_addr
from .liveness import HEARTBEAT_INTERVAL_S, Heartbeats, silence_limit

logger = logging.getLogger(__name__)


def run_watch(args: ServerArgs, ready: Any = None) -> None:
    import torch.distributed as dist

    layout = Layout(args.tp_size, args.nnodes)
    remote = [r for r in range(args.tp_size) if layout.node_of(r) != 0]
    host, port = parse_addr(args.dist_init_addr)
    try:
        store = dist.TCPStore(host, port, is_master=False,
                              timeout=timedelta(seconds=args.dist_timeout))
    except Exception as exc:  # rank 0 never served the store: the scheduler reports why
        logger.debug("rank watch: no store at %s: %s", args.dist_init_addr, exc)
        _idle()
    heartbeats = Heartbeats(remote, silence_limit(args.dist_timeout))
    while True:
        time.sleep(HEARTBEAT_INTERVAL_S)
        try:
            silent = heartbeats.silent(store)
        except Exception as exc:  # rank 0's store is gone: the scheduler died, it reports
            logger.debug("rank watch: store lost: %s", exc)
            _idle()
        if silent:
            logger.error("tensor-parallel rank %d (node %d) has not answered for %.0f s: "
                         "that node's ranks are gone, and the model cannot run without "
                         "them; the server stops", silent[0], layout.node_of(silent[0]),
                         heartbeats.limit)
            fast_exit(1)


def _idle() -> None:
    while True:
        time.sleep(3600)
