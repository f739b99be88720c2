"""Where the ranks of --tp-size run, and --dist-init-addr's parts: torch-free, so the server's
launcher (which holds no model) can place the ranks without importing torch (~0.25 GB)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """Where the ranks of --tp-size run: `nnodes` nodes with tp_size / nnodes ranks each."""

    tp_size: int
    nnodes: int = 1

    @property
    def per_node(self) -> int:
        return self.tp_size // self.nnodes

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.per_node

    def ranks_of(self, node: int) -> range:
        return range(node * self.per_node, (node + 1) * self.per_node)


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)
