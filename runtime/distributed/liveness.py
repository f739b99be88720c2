"""Is every other rank still there? Asked by a rank whose collective is slow to finish.

gloo reports a dead peer at once ("Connection closed by peer") when the peer's sockets close,
but not in every case: a collective can wait forever on a rank that is gone (seen in CI: rank
0's broadcast to a SIGKILLed worker; and a process the dead rank forked keeps its sockets
open). A collective's own timeout cannot bound that, since a worker waits in one for the next
batch plan for as long as the server idles. So a rank waits for a CPU collective in slices,
and between slices asks here:

- ranks on its own node: is their process alive (each rank publishes its pid at join)?
- ranks on other nodes than 0: has their heartbeat counter moved within the silence limit
  (they beat it every second: parallel_state.py)?
- on a node other than 0: does rank 0's store still answer (rank 0 serves it)?

Nothing here runs while collectives finish in time, so the hot path pays for none of it.
"""

from __future__ import annotations

import os
import time

from .layout import Layout

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_KEY = "radixflow/heartbeat/{rank}"
PID_KEY = "radixflow/pid/{rank}"
MAX_SILENCE_S = 10.0  # or --dist-timeout, if shorter


def silence_limit(dist_timeout_s: float) -> float:
    """How long a rank on another node may miss its heartbeats before it counts as gone."""
    return max(3 * HEARTBEAT_INTERVAL_S, min(dist_timeout_s, MAX_SILENCE_S))


def publish_pid(store, rank: int) -> None:
    store.set(PID_KEY.format(rank=rank), str(os.getpid()))


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
        return state in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


class Heartbeats:
    """The ranks whose heartbeat counters stood still for longer than `limit` seconds (a rank
    that never beat yet is not judged)."""

    def __init__(self, ranks: list[int], limit: float):
        self.ranks, self.limit = ranks, limit
        self._last: dict[int, int] = {}
        self._since: dict[int, float] = {}

    def silent(self, store) -> list[int]:
        """Reads every counter (a store that does not answer raises)."""
        now, gone = time.monotonic(), []
        for rank in self.ranks:
            beats = store.add(HEARTBEAT_KEY.format(rank=rank), 0)
            if beats != self._last.get(rank):
                self._last[rank], self._since[rank] = beats, now
            elif beats and now - self._since[rank] > self.limit:
                gone.append(rank)
        return gone


class Liveness:
    """One rank's view of the others, through the group's store."""

    def __init__(self, store, rank: int, layout: Layout, dist_timeout_s: float):
        self.store, self.rank, self.layout = store, rank, layout
        node = layout.node_of(rank)
        self.neighbours = [r for r in layout.ranks_of(node) if r != rank]
        self.heartbeats = Heartbeats([r for r in range(layout.tp_size)
                                      if layout.node_of(r) not in (0, node)],
                                     silence_limit(dist_timeout_s))
        self._pids: dict[int, int] = {}
        self._store_elsewhere = node != 0  # rank 0's process serves the store

    def lost(self) -> str | None:
        """Why some other rank is gone, or None while all seem there."""
        for rank in self.neighbours:
            pid = self._pid(rank)
            if pid is not None and process_gone(pid):
                return f"rank {rank}'s process (pid {pid}) has exited"
        try:
            silent = self.heartbeats.silent(self.store)
            if self._store_elsewhere:
                self.store.check([PID_KEY.format(rank=0)])
        except Exception as exc:
            return f"rank 0's store does not answer: {exc}"
        if silent:
            return (f"rank {silent[0]} (node {self.layout.node_of(silent[0])}) sent no "
                    f"heartbeat for {self.heartbeats.limit:g} s")
        return None

    def _pid(self, rank: int) -> int | None:
        if rank not in self._pids:
            key = PID_KEY.format(rank=rank)
            try:  # (get would block until the key is set)
                if not self.store.check([key]):
                    return None
                self._pids[rank] = int(self.store.get(key))
            except Exception:  # the store is gone: the heartbeat check says so
                return None
        return self._pids[rank]
