"""Where the ranks meet (--dist-init-addr), and who else can reach it.

torch.distributed's TCPStore has no authentication: whoever connects to it can read and
write its keys, join the group or break it. So:

- a --dist-init-addr whose host is not a loopback address is refused unless
  --dist-trusted-network: `check_dist_init_addr` in runtime/parallel_flags.py, a leaf that
  ServerArgs calls as well;
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
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from ..parallel_flags import is_loopback_host


def split_addr(addr: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


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
