"""A radix tree's invariants and an indented dump: for tests, debugging and an idle scheduler.

Cold code, kept out of radix_tree.py so the hot paths (match_prefix, insert) read on one page.
`RadixTree.check()` and `RadixTree.pretty()` call these.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixflow.radix_cache.radix_tree import RadixTree


def short_key(key: list[int], limit: int = 8) -> str:
    """A key as a list literal, cut after `limit` tokens with the count of the rest."""
    if len(key) <= limit:
        return str(key)
    return f"[{', '.join(map(str, key[:limit]))}, ... +{len(key) - limit}]"


def namespace_label(namespace: str) -> str:
    """A namespace (a tenant's cache_salt) as views show it: a short digest, not the salt."""
    return "ns:" + hashlib.sha256(namespace.encode()).hexdigest()[:8]


def check_tree(tree: RadixTree) -> None:
    """Assert every invariant of `tree`."""
    root = tree.root
    assert root.parent is None and not root.key and root.lock_ref == 0
    evictable_len = protected_len = 0
    leaves = set()
    stack = [root]
    while stack:
        node = stack.pop()
        child_locks = 0
        for first, child in node.children.items():
            if child.namespace is not None:
                assert node is root and first == child.namespace, f"{child!r} misfiled"
                assert not child.key and not len(child.value), f"namespace {child!r} holds tokens"
                assert child.children, f"empty namespace {child!r} kept"
            else:
                assert child.key, f"empty key below {node!r}"
                assert child.key[0] == first, f"{child!r} filed under token {first}"
            assert child.parent is node, f"{child!r} has a wrong parent"
            assert len(child.value) == len(child.key), f"{child!r}: len(value) != len(key)"
            assert child.last_access <= node.last_access or node is root, (
                f"{child!r} accessed after its parent {node!r}")
            child_locks += child.lock_ref
            stack.append(child)
        if node is root:
            continue
        # lock_ref = direct locks on the node + the locks of its children
        assert node.lock_ref >= child_locks, f"{node!r}: lock_ref < children's locks"
        if node.namespace is not None:  # never locked itself, never a leaf
            assert node.lock_ref == child_locks, f"namespace {node!r} locked directly"
            continue
        if node.lock_ref:
            protected_len += len(node.key)
        else:
            evictable_len += len(node.key)
            if not node.children:
                leaves.add(node)
    assert evictable_len == tree.evictable_size(), (evictable_len, tree.evictable_size())
    assert protected_len == tree.protected_size(), (protected_len, tree.protected_size())
    assert leaves == tree.evictable_leaves(), "evictable leaf set out of date"
    if tree.disabled:
        assert not root.children, "a disabled tree stored something"


def pretty_tree(tree: RadixTree) -> str:
    """Indented dump: one line per node with its key, lock_ref and last_access."""
    lines = [f"root (evictable={tree.evictable_size()}, protected={tree.protected_size()})"]
    stack = [(child, 1) for child in reversed(list(tree.root.children.values()))]
    while stack:
        node, depth = stack.pop()
        what = short_key(node.key) if node.namespace is None else namespace_label(node.namespace)
        lines.append(f"{'  ' * depth}{what} lock={node.lock_ref} t={node.last_access}")
        stack.extend((child, depth + 1) for child in reversed(list(node.children.values())))
    return "\n".join(lines)
