"""Tensor parallelism's rendezvous (--dist-init-addr) and who can reach it.

torch.distributed's store has no authentication: a --dist-init-addr that is not loopback is
refused without --dist-trusted-network (before any rank starts), and rank 0's store listens
on the given address only, not on every interface as torch's TCPStore does by itself; on a
loopback rendezvous gloo's own listeners are on loopback too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixflow.runtime.distributed.rendezvous import serve_store
from radixflow.runtime.parallel_flags import check_dist_init_addr, is_loopback_host
from radixflow.runtime.server.process import free_port


def _args(addr, trusted=False, tp_size=2):
    return SimpleNamespace(dist_init_addr=addr, dist_trusted_network=trusted, tp_size=tp_size)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "localhost", "LOCALHOST", "[::1]",
                                  "::1", "::ffff:127.0.0.1"])
def test_loopback_hosts(host):
    assert is_loopback_host(host)
    check_dist_init_addr(_args(f"{host}:29500"))


@pytest.mark.parametrize("host", ["10.0.0.1", "0.0.0.0", "192.168.1.5", "node0", "[::]",
                                  "fe80::1", "localhost.evil.example", "128.0.0.1"])
def test_a_network_address_is_refused_without_the_trusted_flag(host):
    assert not is_loopback_host(host)
    with pytest.raises(ValueError) as info:
        check_dist_init_addr(_args(f"{host}:29500"))
    message = str(info.value)
    assert "--dist-init-addr" in message and "--dist-trusted-network" in message
    assert "no authentication" in message
    check_dist_init_addr(_args(f"{host}:29500", trusted=True))  # the user vouches for it
    check_dist_init_addr(_args(f"{host}:29500", tp_size=1))  # no store without --tp-size > 1


def test_tp_args_refuses_before_any_rank_starts(tmp_path):
    """launch.tp_args (the server's launcher and Engine) checks before it reads the model."""
    from radixflow.runtime.distributed.launch import tp_args, tp_launch_args
    from radixflow.runtime.errors import ServerUnavailable
    from radixflow.runtime.server_args import ServerArgs

    fields = {"model": str(tmp_path / "missing"), "tp_size": 2, "nnodes": 2,
              "dist_init_addr": "10.0.0.1:29500"}
    with pytest.raises(ValueError, match="--dist-trusted-network"):
        ServerArgs(**fields)  # a usage error at the command line already
    args = ServerArgs(**fields, dist_trusted_network=True)
    args.dist_trusted_network = False  # as an Engine's caller could set it after the checks
    with pytest.raises(ValueError, match="--dist-trusted-network"):
        tp_args(args)
    with pytest.raises(ServerUnavailable, match="--dist-trusted-network"):
        tp_launch_args(args)


def _listening(port: int) -> list[str]:
    """Local addresses ('0100007F:1F90') of the sockets listening on `port`, any process."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.append(fields[1].rsplit(":", 1)[0])
    return found


IPV4_LOOPBACK = "0100007F"
IPV6_LOOPBACK = "00000000000000000000000001000000"


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
def test_the_store_listens_on_the_given_host_only():
    port = free_port()
    store = serve_store("127.0.0.1", port, 1, timedelta(seconds=10))
    try:
        assert _listening(port) == [IPV4_LOOPBACK]
        import torch.distributed as dist

        client = dist.TCPStore("127.0.0.1", port, is_master=False,
                               timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert store.get("k") == b"v"
        del client
    finally:
        del store
    port = free_port()
    store = serve_store("localhost", port, 1, timedelta(seconds=10))  # IPv4 preferred
    try:
        assert _listening(port) == [IPV4_LOOPBACK]
    finally:
        del store


def test_rank0_cannot_serve_an_address_that_is_not_its_own():
    with pytest.raises(OSError, match="cannot listen on 192.0.2.1"):
        serve_store("192.0.2.1", free_port(), 1, timedelta(seconds=2))  # TEST-NET-1


RANK = r"""
import json, os, sys
from pathlib import Path
import torch
from radixflow.runtime.distributed.parallel_state import Layout, TensorParallel

def listening_here():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                found.append(f[1].rsplit(":", 1)[0])
    return found

rank, addr = int(sys.argv[1]), sys.argv[2]
tp = TensorParallel(rank, Layout(2, 1), torch.device("cpu"), None, addr, 30.0)
tp._join("gloo")
t = torch.ones(1)
tp.all_reduce(t)
print(json.dumps({"rank": rank, "sum": float(t), "listening": listening_here()}), flush=True)
tp.all_agree(True)  # both have looked before either leaves
tp.close()
"""


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
def test_a_loopback_rendezvous_listens_on_loopback_only():
    """Two gloo ranks at rendezvous: every socket either listens on is 127.0.0.1 (the
    store's, on rank 0, and gloo's pair listeners)."""
    addr = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL", "OMP_NUM_THREADS": "1"}
    env.pop("GLOO_SOCKET_IFNAME", None)
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), addr], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert [o["sum"] for o in outs] == [2.0, 2.0]
    port = int(addr.rsplit(":", 1)[1])
    assert _listening(port) == [], "the store is gone with rank 0"
    assert len(outs[0]["listening"]) >= 2, outs  # the store and gloo's listener
    for o in outs:
        assert all(a in (IPV4_LOOPBACK, IPV6_LOOPBACK) for a in o["listening"]), o

