"""An approximate, multi-tenant prefix tree: which prompts went to which worker.

The router cannot see a worker's radix cache, so it keeps its own record of the prompts it
sent there (SGLang's router does the same): a radix tree over characters whose nodes list
the tenants (workers, replicas) that were sent a prompt running through them, each with the
time it last did. A tenant's part of the tree is prefix-closed (a node's tenants are among
its parent's), so the deepest node of a prompt's path that a tenant is on gives that
tenant's match.

Keys are `str`: a prompt's text, or its token ids as characters (`token_key`), so one
structure serves the HTTP router (text) and the in-process replicas (token ids). Sizes
count characters. Eviction drops a tenant's least recently used leaves until its size is
at most the limit, as SGLang's `evict_tenant_by_size` does.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Hashable, Iterable, Sequence

Tenant = Hashable


def token_key(ids: Sequence[int]) -> str:
    """Token ids as a string key, one character per id (ids below 0x110000)."""
    return "".join(map(chr, ids))


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix (slice comparisons run in C; O(n log n))."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class _Node:
    __slots__ = ("text", "children", "tenants", "parent")

    def __init__(self, text: str, parent: _Node | None):
        self.text = text  # the edge from the parent
        self.children: dict[str, _Node] = {}  # by first character
        self.tenants: dict[Tenant, float] = {}  # tenant -> last access (monotonic seconds)
        self.parent = parent


class PrefixTree:
    def __init__(self, tenants: Iterable[Tenant] = ()):
        self.root = _Node("", None)
        self.tenant_chars: dict[Tenant, int] = {}
        for tenant in tenants:
            self.add_tenant(tenant)

    # -- tenants ---------------------------------------------------------------------------

    def add_tenant(self, tenant: Tenant) -> None:
        self.root.tenants.setdefault(tenant, time.monotonic())
        self.tenant_chars.setdefault(tenant, 0)

    def remove_tenant(self, tenant: Tenant) -> None:
        """Drop the tenant from every node, and the nodes no tenant is left on."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            node.tenants.pop(tenant, None)
            stack.extend(c for c in node.children.values() if tenant in c.tenants)
        self._prune(self.root)
        self.root.tenants.pop(tenant, None)
        self.tenant_chars.pop(tenant, None)

    def _prune(self, node: _Node) -> None:
        """Cut off the children no tenant is on (their subtrees have none either)."""
        stack = [node]
        while stack:
            node = stack.pop()
            for key, child in list(node.children.items()):
                if child.tenants:
                    stack.append(child)
                else:
                    del node.children[key]
                    child.parent = None

    def clear(self) -> None:
        """Forget every prompt; the tenants stay, with size 0 (after a cache flush)."""
        tenants = list(self.tenant_chars)
        self.root = _Node("", None)
        self.tenant_chars = {}
        for tenant in tenants:
            self.add_tenant(tenant)

    def size(self, tenant: Tenant) -> int:
        return self.tenant_chars.get(tenant, 0)

    # -- insert and match ------------------------------------------------------------------

    def insert(self, text: str, tenant: Tenant) -> None:
        """Record that `text` was sent to `tenant`."""
        now = time.monotonic()
        self.add_tenant(tenant)
        node, i = self.root, 0
        node.tenants[tenant] = now
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                new = _Node(text[i:], node)
                new.tenants[tenant] = now
                node.children[text[i]] = new
                self.tenant_chars[tenant] += len(text) - i
                return
            shared = common_prefix_len(child.text, text[i:i + len(child.text)])
            if shared < len(child.text):  # split the edge: node -> mid -> child
                mid = _Node(child.text[:shared], node)
                mid.tenants = dict(child.tenants)
                child.text = child.text[shared:]
                child.parent = mid
                mid.children[child.text[0]] = child
                node.children[text[i]] = mid
                child = mid
            if tenant not in child.tenants:
                self.tenant_chars[tenant] += len(child.text)
            child.tenants[tenant] = now
            node, i = child, i + shared

    def match(self, text: str) -> dict[Tenant, int]:
        """Each tenant's longest prefix of `text` (characters), for tenants with one > 0."""
        out: dict[Tenant, int] = {}
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            shared = common_prefix_len(child.text, text[i:i + len(child.text)])
            i += shared
            for tenant in child.tenants:
                out[tenant] = i
            if shared < len(child.text):
                break
            node = child
        return out

    # -- eviction --------------------------------------------------------------------------

    def evict(self, max_size: int) -> None:
        """Drop least recently used leaves of each tenant larger than `max_size`."""
        over = {t for t, n in self.tenant_chars.items() if n > max_size}
        if not over:
            return
        order = itertools.count()
        heap: list[tuple[float, int, Tenant, _Node]] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is self.root:
                continue
            for tenant in over & node.tenants.keys():
                if not any(tenant in c.tenants for c in node.children.values()):
                    heapq.heappush(heap, (node.tenants[tenant], next(order), tenant, node))
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.tenant_chars[tenant] <= max_size or tenant not in node.tenants:
                continue
            del node.tenants[tenant]
            self.tenant_chars[tenant] -= len(node.text)
            parent = node.parent
            if not node.tenants and parent is not None:
                del parent.children[node.text[0]]
                node.parent = None
            if (parent is not None and parent is not self.root and tenant in parent.tenants
                    and not any(tenant in c.tenants for c in parent.children.values())):
                heapq.heappush(heap, (parent.tenants[tenant], next(order), tenant, parent))
