"""The parallelism flags checked before anything starts: --tp-size, --nnodes, --node-rank,
--dist-init-addr and --dp-size that cannot work together, and who may reach the rendezvous.

torch.distributed's store has no authentication: whoever connects to it can read and write
its keys, join the group or break it. So a --dist-init-addr whose host is not a loopback
address (127.0.0.0/8, ::1, localhost) is refused unless --dist-trusted-network says the
network between the nodes is trusted (a private network, a VPN, a firewall that admits only
the nodes). distributed/rendezvous.py binds the store to that address.

A leaf (the standard library only): ServerArgs runs these checks, and distributed/ runs
check_dist_init_addr again before a group forms (args can change after ServerArgs checked them).
"""

from __future__ import annotations

import ipaddress
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "localhost.localdomain"})


def check_parallel_flags(args: Any) -> None:
    """ValueError for --tp-size, --nnodes, --node-rank, --dist-init-addr, --dp-size that
    cannot work together. (That the model's heads and sizes split is checked when it loads:
    runtime/distributed.)"""
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank must be in [0, {args.nnodes - 1}] with --nnodes "
                         f"{args.nnodes}, got {args.node_rank}")
    if args.tp_size % args.nnodes:
        raise ValueError(f"--tp-size {args.tp_size} cannot be spread evenly over --nnodes "
                         f"{args.nnodes}: each node runs tp_size / nnodes ranks")
    if args.nnodes > 1 and not args.dist_init_addr:
        raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT, the address of "
                         "node 0 every node can reach")
    if args.dist_init_addr is not None:
        host, _, port = args.dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--dist-init-addr must be HOST:PORT, got "
                             f"{args.dist_init_addr!r}")
        check_dist_init_addr(args)  # an unauthenticated store on a network: opt in
    if args.tp_size > 1 and args.dp_size > 1:
        raise ValueError("--tp-size > 1 with --dp-size > 1 is not supported yet: run "
                         "either several replicas or one model split over ranks")


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 (and ::ffff:127.x.y.z), or localhost. Other names are not looked up:
    what a name resolves to can change."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def check_dist_init_addr(args: Any) -> None:
    """ValueError for a --dist-init-addr that is not loopback without --dist-trusted-network
    (only with --tp-size > 1: otherwise there is no store)."""
    addr = getattr(args, "dist_init_addr", None)
    if not addr or getattr(args, "tp_size", 1) <= 1 or getattr(args, "dist_trusted_network",
                                                                 False):
        return
    host, _, _ = addr.rpartition(":")
    if host and not is_loopback_host(host):
        raise ValueError(
            f"--dist-init-addr {addr} is not a loopback address: the ranks meet through "
            f"torch.distributed's store, which has no authentication, so any host that can "
            f"reach {addr} could join or disrupt the job and read what the ranks exchange. "
            f"Add --dist-trusted-network if the network between the nodes is trusted "
            f"(private, firewalled to the nodes), or use a 127.0.0.1 address on one node")
