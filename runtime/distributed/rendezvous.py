"""Where the ranks meet (--dist-init-addr), and who else can reach it.

torch.distributed's TCPStore has no authentication: whoever connects to it can read and
write its keys, join the group or break it. So:

- `check_dist_init_addr(args)`: a --dist-init-addr whose host is not a loopback address
  (127.0.0.0/8, ::1, localhost) is refused unless --dist-trusted-network says the network
  between the nodes is trusted (a private network, a VPN, a firewall that admits only the
  nodes). It imports nothing heavy, so ServerArgs can call it.
- `serve_store(...)`: rank 0's store listens on the --dist-init-addr host only; torch's own
  TCPStore(is_master=True) listens on every interface ([::]) whatever host it is given, so
  the socket is bound here and handed to it (master_listen_fd).
- `loopback_only(host)`: while a group is built for a loopback rendezvous, gloo's own
  listening sockets (one per pair of ranks) are bound to the loopback interface too, rather
  than to the address this machine's hostname resolves to.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "localhost.localdomain"})


def split_addr(addr: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


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


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to `host` (IPv4 preferred when a name has both)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    assert last is not None  # (getaddrinfo raises rather than return nothing)
    raise OSError(last.errno, f"cannot listen on {host}:{port}: {last.strerror}"
                  + (" (not an address of this machine)"
                     if last.errno == errno.EADDRNOTAVAIL else ""))


def serve_store(host: str, port: int, world_size: int, timeout: timedelta) -> Any:
    """Rank 0's TCPStore, listening on `host` only."""
    import torch.distributed as dist

    sock = listen_socket(host, port)
    try:
        store = dist.TCPStore(host, port, world_size, True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=sock.fileno(),
                              use_libuv=True)
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now (closing ours would stop it)
    return store


def loopback_interface() -> str | None:
    with contextlib.suppress(OSError):
        for _, name in socket.if_nameindex():
            if name == "lo" or name.startswith("lo0"):
                return name
    return None


@contextlib.contextmanager
def loopback_only(host: str) -> Iterator[None]:
    """For a loopback `host`: GLOO_SOCKET_IFNAME set to the loopback interface (unless the
    user set it) while the group is built; restored afterwards."""
    iface = loopback_interface() if is_loopback_host(host) else None
    if iface is None or "GLOO_SOCKET_IFNAME" in os.environ:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
