"""Starting the ranks of --tp-size: Engine's subprocesses, the server's children, other nodes.

- `tp_args(args)`: before anything starts, check that the model splits (naming the numbers
  when it does not), refuse a --dist-init-addr that is not loopback without
  --dist-trusted-network (runtime/parallel_flags.py), and fill in --dist-init-addr (a free port on
  127.0.0.1 on one node).
- `TPWorkers.start(args)`: Engine's ranks 1.. of node 0 as subprocesses
  (`python -m radixflow.runtime.distributed.worker`); rank 0 is the Engine's own process.
- `start_node_ranks(args, children)`: the server's launcher on node 0 starts the ranks
  of its node besides 0 (and, with --nnodes > 1, watch.py's watcher) as its children, so a
  rank that dies stops the server like any other child.
  (server/launch.py's serve_other_node uses it on nodes K > 0, which run only model ranks.)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import subprocess
import sys
import time
from typing import Any

from ..errors import ServerUnavailable
from ..parallel_flags import check_dist_init_addr
from ..server_args import ServerArgs
from .layout import Layout

logger = logging.getLogger(__name__)

WORKER_ENTRY = "radixflow.runtime.distributed.worker:run_worker"
WATCH_ENTRY = "radixflow.runtime.distributed.watch:run_watch"
STOP_TIMEOUT_S = 5.0
# c10d logs every failed connection attempt with a C++ stack trace; the ranks' own errors say
# what failed (set TORCH_CPP_LOG_LEVEL to see them)
QUIET_C10D = {"TORCH_CPP_LOG_LEVEL": "FATAL"}


def _quiet_c10d() -> None:
    for key, value in QUIET_C10D.items():
        os.environ.setdefault(key, value)


def tp_args(args: ServerArgs, folder: Any = None) -> ServerArgs:
    """`args` ready for the ranks (unchanged when --tp-size is 1): the model's split checked
    (ValueError naming its heads / KV heads / intermediate size), --dist-init-addr filled."""
    if args.tp_size == 1:
        return args
    check_dist_init_addr(args)  # an unauthenticated store on a network: only when trusted
    from ..model_loader import load_config, resolve_model
    from ..models.config import ModelArgs
    from .split import check_split

    folder = folder or resolve_model(args.model)
    check_split(ModelArgs.from_hf_config(load_config(folder)), args.tp_size)
    if args.dist_init_addr is None:
        from ..ipc import free_port

        args = args.replace(dist_init_addr=f"127.0.0.1:{free_port()}")
    return args.replace(model=str(folder))


def tp_launch_args(args: ServerArgs) -> ServerArgs:
    """tp_args for the server's launcher: a model that does not split is a ServerUnavailable
    (logged, exit code 1), like other start-up failures."""
    try:
        args = tp_args(args)
    except ValueError as exc:
        raise ServerUnavailable(f"cannot start: {exc}") from None
    if args.tp_size > 1:
        _quiet_c10d()  # the launcher's children (the ranks) inherit it
    return args


# ---- Engine ----


class TPWorkers:
    """An Engine's worker ranks (none for --tp-size 1); `args` is what rank 0 runs with."""

    def __init__(self, args: ServerArgs, procs: list[subprocess.Popen]):
        self.args, self.procs = args, procs

    @classmethod
    def start(cls, args: ServerArgs) -> TPWorkers:
        if args.tp_size == 1:
            return cls(args, [])
        if args.node_rank != 0:
            raise ValueError("Engine runs node 0 of --nnodes (the scheduler's); start the "
                             "other nodes with `radixflow serve --node-rank K`")
        args = tp_args(args)
        layout = Layout(args.tp_size, args.nnodes)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        procs = []
        for rank in layout.ranks_of(0)[1:]:
            proc = subprocess.Popen([sys.executable, "-m", "radixflow.runtime.distributed.worker"],
                                    stdin=subprocess.PIPE, env={**QUIET_C10D, **os.environ})
            proc.stdin.write(pickle.dumps((args, rank, level, os.getpid())))
            proc.stdin.close()
            procs.append(proc)
        workers = cls(args, procs)
        atexit.register(workers.stop)
        return workers

    def stop(self) -> None:
        """Rank 0 tells the workers to exit and leaves the group; stragglers are killed."""
        from .parallel_state import current

        tp = current()
        if tp is not None and tp.is_driver:
            if tp.failure is None and tp.serving:
                from .plan import send_shutdown

                with contextlib.suppress(Exception):
                    send_shutdown(tp)
            tp.close()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

    def dead(self) -> list[tuple[int, int]]:
        """(pid, exit code) of workers that have exited."""
        return [(p.pid, p.returncode) for p in self.procs if p.poll() is not None]


# ---- the server ----


def start_node_ranks(args: ServerArgs, children: Any) -> None:
    """Start this node's ranks except 0 as the launcher's children (after the scheduler,
    rank 0, on node 0), and node 0's watch over other nodes."""
    if args.tp_size == 1:
        return
    layout = Layout(args.tp_size, args.nnodes)
    for rank in layout.ranks_of(args.node_rank):
        if rank != 0:
            children.start(f"tp-rank-{rank}", WORKER_ENTRY, args, rank)
    if args.node_rank == 0 and args.nnodes > 1:
        children.start("tp-watch", WATCH_ENTRY, args)
