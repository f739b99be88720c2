"""Radix tree over token ids -> KV slots, so a shared prompt prefix is computed once.

Pure Python: a node's value is any sliceable sequence of KV slots (a list of ints or a 1-D
tensor); the tree only slices it and takes its length. The tree never frees slots itself:
`insert` says how many of the given slots were duplicates, `evict` and `reset` hand back the
slots they drop, and the caller returns them to its pool.

Namespaces (a request's `cache_salt`): `match_prefix`, `insert` take `namespace=`, a string;
each namespace is a child of the root that holds no tokens (filed under the string, where
token children are filed under ints; `node.namespace` names it), so a prefix cached in one
namespace never matches in another nor in the unsalted tree (`namespace=None`). Eviction is one
LRU over every namespace; a namespace left empty is dropped.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from radixflow.radix_cache.tree_audit import check_tree, pretty_tree, short_key


class TreeNode:
    """One edge of the tree: a token-id segment and the KV slots that hold it."""

    __slots__ = ("children", "key", "value", "parent", "lock_ref", "last_access", "hits",
                 "namespace")

    def __init__(self, key: list[int], value: Any, parent: TreeNode | None,
                 last_access: float = 0, namespace: str | None = None) -> None:
        # keyed by the first token of the child's key (the root's namespaces: by their name)
        self.children: dict[int | str, TreeNode] = {}
        self.key = key
        self.value = value  # len(value) == len(key)
        self.parent = parent  # None for the root and for nodes dropped from the tree
        self.lock_ref = 0  # locks on this node or any descendant
        self.last_access = last_access
        self.hits = 0  # requests whose cached prefix ran through this node (record_hit)
        self.namespace = namespace  # set on a namespace's own (token-less) node only

    def __repr__(self) -> str:
        return (f"TreeNode(key={short_key(self.key)}, lock_ref={self.lock_ref}, "
                f"last_access={self.last_access}, num_children={len(self.children)})")


class _StrictClock:
    """Wall-clock seconds that never repeat nor go back: `last_access` orders the LRU
    exactly (a logical clock would) and still says when a node was last used."""

    def __init__(self) -> None:
        self._last = 0.0

    def __next__(self) -> float:
        self._last = max(time.time(), self._last + 1e-6)
        return self._last


class MatchResult(NamedTuple):
    values: list[Any]  # value segments along the matched path, root first; concatenate them
    length: int  # matched tokens == sum(len(v) for v in values)
    last_node: TreeNode  # covers exactly key[:length]; the root when nothing matched


def common_prefix_len(a: Sequence[int], b: Sequence[int], b_start: int = 0) -> int:
    """Length of the longest common prefix of `a` and `b[b_start:]`."""
    n = min(len(a), len(b) - b_start)
    # Whole-segment equality runs in C and is the common case on a long shared prefix.
    if a[:n] == b[b_start:b_start + n]:
        return n
    i = 0
    while a[i] == b[b_start + i]:
        i += 1
    return i


def _as_token_list(key: Sequence[int]) -> list[int]:
    if isinstance(key, list):
        return key
    if hasattr(key, "tolist"):  # numpy array / torch tensor, without importing either
        return key.tolist()
    return list(key)


class RadixTree:
    """Token-id prefixes -> KV slots, with reference-counted locks and LRU eviction of leaves.

    Sizes count tokens (one token == one slot). Every non-root token is either evictable (its
    node has lock_ref == 0) or protected (lock_ref > 0). With ``disabled=True`` the tree stays
    empty: nothing matches and ``insert`` stores nothing, so the caller keeps all its slots.
    """

    def __init__(self, *, disabled: bool = False) -> None:
        self.disabled = disabled
        self._clock = _StrictClock()
        self.root = TreeNode([], [], None)
        self._evictable_len = 0
        self._protected_len = 0
        self._evictable_leaves: set[TreeNode] = set()  # unlocked, childless, non-root

    # ---- sizes (O(1)) ----

    def evictable_size(self) -> int:
        return self._evictable_len

    def protected_size(self) -> int:
        return self._protected_len

    def total_size(self) -> int:
        return self._evictable_len + self._protected_len

    # ---- lookup and insertion ----

    def match_prefix(self, key: Sequence[int], namespace: str | None = None) -> MatchResult:
        """Longest cached prefix of `key` in `namespace` (None: the unsalted tree).

        Side effects: the nodes on the matched path get a fresh ``last_access``; if the match
        ends inside a node's key, that node is split in two so ``last_node`` covers exactly
        ``key[:length]`` (the tree's contents and sizes do not change). Nothing is locked: call
        ``lock(result.last_node)`` to keep the matched slots from eviction. When nothing
        matched, ``last_node`` is the root, whatever the namespace.
        """
        if self.disabled:
            return MatchResult([], 0, self.root)
        key = _as_token_list(key)
        now = next(self._clock)
        node, values, length = self._start(namespace, now, create=False), [], 0
        if node is None:
            return MatchResult([], 0, self.root)
        while length < len(key):
            child = node.children.get(key[length])
            if child is None:
                break
            n = common_prefix_len(child.key, key, length)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            values.append(child.value)
            length += n
            node = child
        return MatchResult(values, length, node if length else self.root)

    def insert(self, key: Sequence[int], value: Any, namespace: str | None = None) -> int:
        """Store `key` -> `value` (one slot per token) in `namespace` (None: unsalted).

        Returns how many leading tokens of `key` were already cached. The tree keeps
        ``value[returned:]``; ``value[:returned]`` are duplicates that the caller still owns
        and must free. Splits nodes as needed and refreshes ``last_access`` along the path.
        When disabled, stores nothing and returns 0 (the caller owns all of `value`).

        Raises:
            ValueError: ``len(value) != len(key)``.
        """
        if len(value) != len(key):
            raise ValueError(f"insert: len(value)={len(value)} != len(key)={len(key)}")
        if self.disabled or not len(key):
            return 0
        key = _as_token_list(key)
        now = next(self._clock)
        node, length = self._start(namespace, now, create=True), 0
        while length < len(key):
            child = node.children.get(key[length])
            if child is None:
                self._add_leaf(node, key[length:], value[length:], now)
                break
            n = common_prefix_len(child.key, key, length)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            length += n
            node = child
        return length

    def _start(self, namespace: str | None, now: int, *, create: bool) -> TreeNode | None:
        """The node a key of `namespace` starts below (made if `create`), or None."""
        if namespace is None:
            return self.root
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, not {type(namespace).__name__}")
        node = self.root.children.get(namespace)
        if node is None and create:
            node = self.root.children[namespace] = TreeNode([], [], self.root, now, namespace)
        if node is not None:
            node.last_access = now
        return node

    def _split(self, node: TreeNode, n: int) -> TreeNode:
        """Cut `node` after its first n tokens; returns the new upper part.

        The original object keeps the lower part, so references held to it (locked nodes)
        still stand for the same prefix.
        """
        parent = node.parent
        upper = TreeNode(node.key[:n], node.value[:n], parent, node.last_access)
        upper.lock_ref, upper.hits = node.lock_ref, node.hits
        upper.children[node.key[n]] = node
        parent.children[node.key[0]] = upper
        node.key = node.key[n:]
        node.value = node.value[n:]
        node.parent = upper
        return upper

    def _add_leaf(self, parent: TreeNode, key: list[int], value: Any, now: float) -> None:
        leaf = TreeNode(key, value, parent, now)
        parent.children[key[0]] = leaf
        self._evictable_leaves.discard(parent)
        self._evictable_leaves.add(leaf)
        self._evictable_len += len(key)

    # ---- locks ----

    def record_hit(self, node: TreeNode) -> None:
        """Count one request reusing the path root..node (the cache view shows the counts)."""
        while node is not None and node is not self.root:
            node.hits += 1
            node = node.parent

    def lock(self, node: TreeNode) -> None:
        """+1 lock on `node` and its ancestors (root excluded); their tokens become protected."""
        self._assert_attached(node)
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable_len -= len(node.key)
                self._protected_len += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``. Raises AssertionError on an unlock with no matching lock."""
        self._assert_attached(node)
        if node is not self.root and node.lock_ref <= 0:
            raise AssertionError(f"unlock of an unlocked node: {node!r}")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_len += len(node.key)
                self._protected_len -= len(node.key)
                if not node.children:
                    self._evictable_leaves.add(node)
            node = node.parent

    def _assert_attached(self, node: TreeNode) -> None:
        if node is not self.root and node.parent is None:
            raise AssertionError(f"node is not in the tree (evicted or reset): {node!r}")

    # ---- freeing ----

    def evict(self, num_tokens: int) -> list[Any]:
        """Drop least-recently-used unlocked leaves until >= `num_tokens` tokens are freed.

        A parent left childless (and unlocked) becomes a candidate in turn. Stops early when
        nothing is evictable. Returns the dropped value segments; the caller frees the slots.
        """
        heap = [(leaf.last_access, id(leaf), leaf) for leaf in self._evictable_leaves]
        heapq.heapify(heap)
        evicted: list[Any] = []
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            leaf.parent = None
            self._evictable_leaves.remove(leaf)
            self._evictable_len -= len(leaf.key)
            evicted.append(leaf.value)
            freed += len(leaf.key)
            if parent.namespace is not None and not parent.children:
                del self.root.children[parent.namespace]  # an empty namespace: dropped
                parent.parent = None
            elif parent is not self.root and not parent.children and parent.lock_ref == 0:
                self._evictable_leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return evicted

    def reset(self) -> list[Any]:
        """Drop every node and return all their value segments for the caller to free.

        Raises:
            RuntimeError: some node is still locked (a running request holds it).
        """
        if self._protected_len:
            raise RuntimeError(
                f"cannot reset the radix tree: {self._protected_len} tokens are locked")
        values: list[Any] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.namespace is None:
                values.append(node.value)
            node.parent = None
            stack.extend(node.children.values())
        # NOTE: the root object survives, so a request holding it as its (no-op) lock is fine.
        self.root.children = {}
        self._evictable_len = 0
        self._evictable_leaves.clear()
        return values

    # ---- debugging ----

    def evictable_leaves(self) -> frozenset[TreeNode]:
        """The unlocked, childless, non-root nodes: the next candidates for eviction."""
        return frozenset(self._evictable_leaves)

    def check(self) -> None:
        """Assert every invariant of the tree; for tests and an idle scheduler."""
        check_tree(self)

    def pretty(self) -> str:
        """Indented dump: one line per node with its key, lock_ref and last_access."""
        return pretty_tree(self)
