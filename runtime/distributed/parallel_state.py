"""One rank's tensor-parallel group: torch.distributed over gloo on CPU, NCCL on CUDA.

Rank 0 is the scheduler's process; ranks 1..tp_size-1 are worker processes (worker.py) on the
same node or, with --nnodes, on others (node n holds ranks n * per_node .. (n+1) * per_node-1).
They meet at --dist-init-addr, a torch.distributed TCPStore that rank 0 serves, listening on
that address only (rendezvous.py; it has no authentication, so an address that is not loopback
needs --dist-trusted-network):

- joining waits at most --dist-timeout seconds (an address nobody answers on, a rank that
  never comes: a clear error, not a hang); then the group's timeout is lengthened;
- collectives themselves have no short timeout, since a worker waits for the next batch plan
  for as long as the server idles; a rank that dies breaks its peers' connections, and gloo
  mostly reports that at once ("Connection closed by peer"), which is turned into RankLost
  here; where it does not, a CPU collective is waited for in slices, and between them
  liveness.py asks whether the other ranks are still there (and a serving rank 0 gives up
  on ranks that are there but silent for --dist-timeout);
- ranks on nodes other than 0 also beat a heartbeat counter in the store, which the launcher
  of node 0 watches (watch.py), so a node that goes away ends an idle server too.

The process group is torch's default group, so a process holds one at a time: `close()` (Engine
shutdown) destroys it and a later Engine can build another.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import Fatal
from ..models.config import ModelArgs
from ..parallel_flags import check_dist_init_addr
from .layout import Layout, parse_addr
from .liveness import HEARTBEAT_INTERVAL_S, HEARTBEAT_KEY, Liveness, publish_pid
from .rendezvous import loopback_only, serve_store
from .sharding import ShardSpec

logger = logging.getLogger(__name__)

# A worker waits in a collective for the next batch plan while the server idles.
OP_TIMEOUT = timedelta(days=30)
# How long a CPU collective runs before its rank asks whether the others are still there.
LIVENESS_SLICE = timedelta(seconds=0.5)

_current: TensorParallel | None = None  # this process's group (one: torch's default group)


class RankLost(Fatal, RuntimeError):
    """A collective failed: some rank died or its connection broke."""


def cpu_threads(num_threads: int | None, ranks_here: int) -> int:
    """torch threads of one rank on a CPU: --num-threads (default: the cores) split over the
    ranks of this node."""
    if num_threads is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count()) or 1
        return max(1, cores // ranks_here)
    return max(1, num_threads // ranks_here)


class TensorParallel:
    """The group as one rank sees it, plus its shard of the model (ShardSpec)."""

    def __init__(self, rank: int, layout: Layout, device: torch.device, spec: ShardSpec,
                 addr: str, timeout_s: float):
        self.rank, self.size, self.layout = rank, layout.tp_size, layout
        self.device, self.spec = device, spec
        self.addr, self.timeout_s = addr, timeout_s
        self.failure: str | None = None
        # seconds spent in (and calls of) each collective, waiting for the others included
        self.comm_seconds: dict[str, float] = {}
        self.comm_calls: dict[str, int] = {}
        self.serving = False  # rank 0: set once every rank waits for batch plans
        self._closed = False
        self._threads_before: int | None = None
        self._heartbeat_stop = threading.Event()
        self._liveness: Liveness | None = None

    @property
    def is_driver(self) -> bool:
        """Rank 0: the one with the scheduler; it sends plans and receives the logits."""
        return self.rank == 0

    # ---- start-up ----

    @classmethod
    def connect(cls, args, rank: int, model_args: ModelArgs) -> TensorParallel:
        """Check the split, pick the device, join the group at --dist-init-addr (rank 0 serves
        it). Raises ValueError (a split the model does not allow, naming the numbers) or
        TimeoutError (nobody answered within --dist-timeout)."""
        global _current
        spec = ShardSpec.create(model_args, args.tp_size, rank)  # raises before any waiting
        if _current is not None and not _current._closed:
            raise RuntimeError("this process already holds a tensor-parallel group; shut the "
                               "other Engine down first")
        if not args.dist_init_addr:
            raise ValueError("--tp-size > 1 needs --dist-init-addr (the launcher or Engine "
                             "picks one)")
        check_dist_init_addr(args)
        layout = Layout(args.tp_size, args.nnodes)
        device = _device(args.device, layout.local_rank(rank), layout.per_node)
        tp = cls(rank, layout, device, spec, args.dist_init_addr, args.dist_timeout)
        if device.type == "cpu":
            tp._threads_before = torch.get_num_threads()
            torch.set_num_threads(cpu_threads(args.num_threads, layout.per_node))
        try:
            tp._join(backend="cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
        except BaseException:
            if tp._threads_before is not None:  # (an Engine's process lives on)
                torch.set_num_threads(tp._threads_before)
            raise
        _current = tp
        logger.info("tensor parallel %s on %s (%d threads), via %s", spec.describe(), device,
                    torch.get_num_threads(), args.dist_init_addr)
        return tp

    def _join(self, backend: str) -> None:
        host, port = parse_addr(self.addr)
        timeout = timedelta(seconds=self.timeout_s)
        where = f"--dist-init-addr {self.addr}"
        start = time.monotonic()
        try:
            if self.rank == 0:  # on the --dist-init-addr host only, not every interface
                store = serve_store(host, port, self.size, timeout)
            else:
                store = dist.TCPStore(host, port, self.size, False, timeout=timeout,
                                      wait_for_workers=False)
        except Exception as exc:  # DistNetworkError, DistStoreError, RuntimeError
            if self.rank == 0:
                raise RuntimeError(f"tensor parallelism: rank 0 cannot serve {where}: "
                                   f"{exc}") from None
            raise TimeoutError(f"tensor parallelism: rank {self.rank} found nobody at {where} "
                               f"within --dist-timeout {self.timeout_s:g} s (is node 0 up, "
                               f"and the address reachable from here?): {exc}") from None
        try:
            # --dist-timeout bounds the rendezvous (every rank connecting to every other)...
            with loopback_only(host):  # gloo's own listeners: loopback too, if the store is
                dist.init_process_group(backend, store=store, rank=self.rank,
                                        world_size=self.size, timeout=timeout)
        except Exception as exc:
            waited = time.monotonic() - start
            raise TimeoutError(f"tensor parallelism: rank {self.rank} waited {waited:.0f} s at "
                               f"{where} and not all {self.size} ranks joined (--dist-timeout "
                               f"{self.timeout_s:g} s): {exc}") from None
        self._store = store
        publish_pid(store, self.rank)
        self._liveness = Liveness(store, self.rank, self.layout, self.timeout_s)
        atexit.register(self.close)
        # ...and OP_TIMEOUT the collectives: a worker waits for plans while the server idles
        from torch.distributed import distributed_c10d

        if hasattr(distributed_c10d, "_set_pg_timeout"):
            distributed_c10d._set_pg_timeout(OP_TIMEOUT)
        else:  # (torch < 2.3) an idle worker's wait for a plan ends after --dist-timeout
            logger.warning("this torch cannot lengthen the group's timeout: set --dist-timeout "
                           "longer than the server may idle")
        if self.layout.node_of(self.rank) != 0:
            threading.Thread(target=self._beat, name="tp-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        key = HEARTBEAT_KEY.format(rank=self.rank)
        host, port = parse_addr(self.addr)
        try:
            store = dist.TCPStore(host, port, is_master=False,
                                  timeout=timedelta(seconds=self.timeout_s))
            while not self._heartbeat_stop.wait(HEARTBEAT_INTERVAL_S):
                store.add(key, 1)
        except Exception as exc:  # rank 0 went away: the next collective says so
            logger.debug("heartbeat stopped: %s", exc)

    def agree_min(self, value: int) -> int:
        """The smallest `value` over the ranks (KV pool size: every rank's pool has the same
        slots)."""
        t = torch.tensor([value], dtype=torch.int64)
        self._run("agree_min", dist.all_reduce, t, op=dist.ReduceOp.MIN)
        return int(t)

    def all_agree(self, flag: bool) -> bool:
        t = torch.tensor([int(flag)], dtype=torch.int64)
        self._run("all_agree", dist.all_reduce, t, op=dist.ReduceOp.MIN)
        return bool(t)

    # ---- collectives of a forward ----

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place (row-parallel layers, vocab-parallel embedding)."""
        if not x.is_contiguous():
            x = x.contiguous()
        self._run("all_reduce", dist.all_reduce, x)
        return x

    def gather_vocab(self, local: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
        """Rank 0: the ranks' vocab shards of `local` ([rows, shard]) side by side, cut to
        `vocab_size` columns; other ranks: None."""
        local = local.contiguous()
        if self.rank == 0:
            parts = [torch.empty_like(local) for _ in range(self.size)]
            self._run("gather", dist.gather, local, parts, dst=0)
            return torch.cat(parts, dim=-1)[:, :vocab_size]
        self._run("gather", dist.gather, local, None, dst=0)
        return None

    def broadcast(self, t: torch.Tensor) -> None:
        """Rank 0's `t` into every rank's (batch plans: CPU tensors, over gloo)."""
        self._run("broadcast", dist.broadcast, t, src=0)

    def _run(self, what: str, fn, *args, **kwargs) -> None:
        if self.failure is not None:
            raise RankLost(self.failure)
        start = time.perf_counter()
        try:
            if args[0].device.type == "cpu" and self._liveness is not None:
                self._wait_while_all_there(fn(*args, async_op=True, **kwargs))
            else:  # NCCL: its own watchdog; waiting here would stall the CUDA stream
                fn(*args, **kwargs)
            self.comm_seconds[what] = (self.comm_seconds.get(what, 0.0)
                                       + time.perf_counter() - start)
            self.comm_calls[what] = self.comm_calls.get(what, 0) + 1
        except RuntimeError as exc:
            who = "rank 0 (the scheduler)" if self.rank else "a tensor-parallel rank"
            self.failure = (f"tensor parallelism: {who} stopped answering ({what} on rank "
                            f"{self.rank} failed: {_short(exc)}); the model cannot run without "
                            "all its --tp-size ranks")
            raise RankLost(self.failure) from None

    def _wait_while_all_there(self, work) -> None:
        """Wait for a gloo collective; between slices of LIVENESS_SLICE, raise RuntimeError if
        another rank is gone, or, on a serving rank 0, if the others have not answered for
        --dist-timeout (a rank that is there but frozen: stopped, swapping, deadlocked; every
        rank runs the same forward, so a healthy one is never that far behind)."""
        start = time.monotonic()
        while True:
            try:
                work.wait(timeout=LIVENESS_SLICE)
                return
            except RuntimeError:
                if work.is_completed():  # it failed (or just finished): its own outcome
                    work.wait()
                    return
            lost = self._liveness.lost()
            if lost is not None:
                raise RuntimeError(lost)
            if self.is_driver and self.serving and time.monotonic() - start > self.timeout_s:
                raise RuntimeError(f"no answer from the other ranks for {self.timeout_s:g} s "
                                   "(--dist-timeout)")

    # ---- shutdown ----

    def close(self) -> None:
        """Leave the group (destroys torch's default process group); idempotent."""
        global _current
        if self._closed:
            return
        self._closed = True
        self._heartbeat_stop.set()
        group = dist.group.WORLD if self.failure is not None and dist.is_initialized() else None
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as exc:  # a broken group: nothing more to do
            logger.debug("destroy_process_group: %s", exc)
        if group is not None:
            # A collective stuck on a lost rank keeps one of gloo's threads, and the group's
            # destructor joins them: the last reference goes on a thread nobody waits for.
            held = [group]
            del group
            threading.Thread(target=held.clear, name="tp-group-release", daemon=True).start()
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
        if _current is self:
            _current = None


def _short(exc: Exception) -> str:
    """gloo's message without its source location and advice: 'Connection closed by peer
    [127.0.0.1]:41909'."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". This is typically")[0]


def current() -> TensorParallel | None:
    """This process's tensor-parallel group, if it holds one."""
    return _current


def _device(name: str, local_rank: int, per_node: int) -> torch.device:
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("--device cuda was given but no CUDA device is available")
    count = torch.cuda.device_count()
    if per_node > count:
        raise ValueError(f"--tp-size runs {per_node} ranks on this node, one GPU each, but it "
                         f"has {count} CUDA device(s)")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)
