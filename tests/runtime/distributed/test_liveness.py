"""A rank whose peer is gone does not wait forever, even where gloo cannot see the death
(liveness.py): real processes, a real gloo group."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from radixflow.runtime.distributed.layout import Layout
from radixflow.runtime.distributed.liveness import Heartbeats, Liveness, process_gone
from radixflow.runtime.distributed.parallel_state import RankLost, TensorParallel
from radixflow.runtime.ipc import free_port

# Rank 1: join, answer one all-reduce; then "freeze": stop itself (SIGSTOP), or else fork a
# child that keeps every socket of this process open (so its death closes no connection),
# print the child's pid and wait for a plan.
RANK_1 = textwrap.dedent("""
    import os, signal, sys, time, torch
    from radixflow.runtime.distributed.layout import Layout
    from radixflow.runtime.distributed.parallel_state import TensorParallel
    tp = TensorParallel(1, Layout(2), torch.device("cpu"), None, sys.argv[1], 30.0)
    tp._join("gloo")
    tp.all_reduce(torch.ones(4))
    if sys.argv[2] == "freeze":
        print(os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    holder = os.fork()
    if holder == 0:
        time.sleep(60)
        os._exit(0)
    print(holder, flush=True)
    tp.broadcast(torch.empty(4))
    time.sleep(60)
""")


def test_a_dead_rank_whose_sockets_stay_open_is_lost_within_seconds():
    addr = f"127.0.0.1:{free_port()}"
    rank1 = subprocess.Popen([sys.executable, "-c", RANK_1, addr, "fork"],
                             stdout=subprocess.PIPE)
    holder = None
    tp = TensorParallel(0, Layout(2), torch.device("cpu"), None, addr, 30.0)
    try:
        tp._join("gloo")
        t = torch.ones(4)
        tp.all_reduce(t)
        assert t.tolist() == [2.0] * 4
        holder = int(rank1.stdout.readline())
        rank1.kill()
        rank1.wait()
        start = time.monotonic()
        with pytest.raises(RankLost, match=rf"rank 1's process \(pid {rank1.pid}\) has exited"):
            for _ in range(3):  # the first may still meet rank 1's posted receive
                tp.broadcast(torch.ones(4))
        assert time.monotonic() - start < 5
        with pytest.raises(RankLost, match="stopped answering"):  # and it stays lost
            tp.all_reduce(torch.ones(4))
    finally:
        tp.close()
        rank1.kill()
        if holder is not None:
            os.kill(holder, signal.SIGKILL)
    assert not dist.is_initialized()


def test_a_frozen_rank_is_lost_after_dist_timeout_while_serving():
    addr = f"127.0.0.1:{free_port()}"
    rank1 = subprocess.Popen([sys.executable, "-c", RANK_1, addr, "freeze"],
                             stdout=subprocess.PIPE)
    tp = TensorParallel(0, Layout(2), torch.device("cpu"), None, addr, 30.0)
    try:
        tp._join("gloo")
        tp.all_reduce(torch.ones(4))
        assert int(rank1.stdout.readline()) == rank1.pid
        tp.timeout_s = 2.0  # (--dist-timeout: 30 s above, for the join)
        tp.serving = True
        start = time.monotonic()
        with pytest.raises(RankLost, match=r"no answer from the other ranks for 2 s "
                                           r"\(--dist-timeout\)"):
            for _ in range(3):
                tp.broadcast(torch.ones(4))
        assert 2.0 <= time.monotonic() - start < 6
    finally:
        tp.close()
        rank1.kill()
        rank1.wait()


def test_process_gone_sees_exit_and_zombies():
    assert not process_gone(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while not process_gone(child.pid):  # exited, not reaped: a zombie
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.wait()
    assert process_gone(child.pid)


def test_heartbeats_silent_only_after_the_limit_and_never_before_a_first_beat():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    beats = Heartbeats([2, 3], limit=0.3)
    store.add("radixflow/heartbeat/2", 1)
    assert beats.silent(store) == []
    time.sleep(0.4)
    assert beats.silent(store) == [2]  # rank 3 never beat: not judged
    store.add("radixflow/heartbeat/2", 1)
    assert beats.silent(store) == []


def test_liveness_asks_neighbours_by_pid_and_other_nodes_by_heartbeat():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    layout = Layout(4, nnodes=2)  # ranks 0, 1 on node 0; 2, 3 on node 1
    live = Liveness(store, 0, layout, dist_timeout_s=3.0)
    assert live.neighbours == [1] and live.heartbeats.ranks == [2, 3]
    assert live.lost() is None  # rank 1 never published a pid: nothing to judge yet
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    store.set("radixflow/pid/1", str(child.pid))
    assert live.lost() == f"rank 1's process (pid {child.pid}) has exited"
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False,
                           timeout=timedelta(seconds=3))
    on_node_1 = Liveness(client, 2, layout, dist_timeout_s=3.0)
    assert on_node_1.neighbours == [3] and on_node_1.heartbeats.ranks == []
    assert on_node_1.lost() is None
    del store, live  # the store's server goes with its last handle: rank 0's process is gone
    lost = on_node_1.lost()
    assert lost is not None and lost.startswith("rank 0's store does not answer"), lost
