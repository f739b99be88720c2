"""RadixTree: a hypothesis state machine against a dict model, plus focused unit tests."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixflow.radix_cache import RadixTree, TreeNode, common_prefix_len

keys = st.lists(st.integers(0, 3), min_size=1, max_size=10)
namespaces = st.sampled_from([None, None, "a", "b"])  # cache_salt; None: unsalted


def path_key(node: TreeNode) -> list[int]:
    """Tokens from the root down to (and including) `node`."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return [t for part in reversed(parts) for t in part]


def namespace_of(node: TreeNode) -> str | None:
    """The namespace a node's prefix lives in (None: the unsalted tree)."""
    while node.parent is not None and node.namespace is None:
        node = node.parent
    return node.namespace


def as_ints(values) -> list[int]:
    out: list[int] = []
    for v in values:
        out.extend(v.tolist() if isinstance(v, torch.Tensor) else v)
    return out


def tree_contents(tree: RadixTree) -> dict[tuple[str | None, tuple[int, ...]], int]:
    """(namespace, prefix) -> slot of its last token, read straight off the nodes."""
    out = {}
    stack = [(child, child.namespace, ()) for child in tree.root.children.values()]
    while stack:
        node, ns, prefix = stack.pop()
        for token, slot in zip(node.key, as_ints([node.value]), strict=True):
            prefix += (token,)
            out[ns, prefix] = slot
        stack.extend((child, ns, prefix) for child in node.children.values())
    return out


class SlotAllocator:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free_slots = list(range(capacity))
        self.free_set = set(self.free_slots)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.free_slots):
            return None
        out = [self.free_slots.pop() for _ in range(n)]
        self.free_set.difference_update(out)
        return out

    def free(self, slots: list[int]) -> None:
        for s in slots:
            assert s not in self.free_set, f"double free of slot {s}"
            self.free_set.add(s)
            self.free_slots.append(s)


class TreeVsModel(RuleBasedStateMachine):
    """The model: `cached` maps every cached (namespace, prefix) to the slot of its last token;
    namespaces never share prefixes."""

    use_tensors = False
    capacity = 40

    def __init__(self):
        super().__init__()
        self.tree = RadixTree()
        self.slots = SlotAllocator(self.capacity)
        self.cached: dict[tuple[str | None, tuple[int, ...]], int] = {}
        self.locks: list[tuple[TreeNode, str | None, tuple[int, ...]]] = []

    def cached_len(self, key: list[int], ns: str | None) -> int:
        n = 0
        while n < len(key) and (ns, tuple(key[: n + 1])) in self.cached:
            n += 1
        return n

    def is_protected(self, entry: tuple[str | None, tuple[int, ...]]) -> bool:
        ns, prefix = entry
        return any(lns == ns and locked[: len(prefix)] == prefix
                   for _, lns, locked in self.locks)

    def do_evict(self, num_tokens: int) -> None:
        evictable_before = self.tree.evictable_size()
        segments = self.tree.evict(num_tokens)
        slots = as_ints(segments)
        by_slot = {slot: prefix for prefix, slot in self.cached.items()}
        for slot in slots:
            prefix = by_slot[slot]
            assert not self.is_protected(prefix), f"evicted locked prefix {prefix}"
            del self.cached[prefix]
        freed = len(slots)
        assert freed <= evictable_before
        if freed < num_tokens:
            assert self.tree.evictable_size() == 0, "stopped while something was evictable"
        elif segments:
            assert freed - len(segments[-1]) < num_tokens, "evicted more leaves than needed"
        self.slots.free(slots)

    @rule(key=keys, ns=namespaces)
    def insert(self, key, ns):
        missing = len(key) - len(self.slots.free_slots)
        if missing > 0:
            self.do_evict(missing)
        slots = self.slots.alloc(len(key))
        if slots is None:  # everything left is locked
            return
        value = torch.tensor(slots) if self.use_tensors else slots
        expected_dup = self.cached_len(key, ns)
        dup = self.tree.insert(key, value, namespace=ns)
        assert dup == expected_dup
        self.slots.free(slots[:dup])
        for i in range(dup, len(key)):
            self.cached[ns, tuple(key[: i + 1])] = slots[i]

    @rule(key=keys, ns=namespaces)
    def match(self, key, ns):
        result = self.tree.match_prefix(key, namespace=ns)
        assert result.length == self.cached_len(key, ns)
        assert as_ints(result.values) == [
            self.cached[ns, tuple(key[: i + 1])] for i in range(result.length)
        ]
        assert path_key(result.last_node) == key[: result.length]
        if result.length:
            assert namespace_of(result.last_node) == ns
        else:
            assert result.last_node is self.tree.root

    @rule(key=keys, ns=namespaces)
    def lock(self, key, ns):
        result = self.tree.match_prefix(key, namespace=ns)
        self.tree.lock(result.last_node)
        self.locks.append((result.last_node, ns, tuple(key[: result.length])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        i = data.draw(st.integers(0, len(self.locks) - 1))
        node, _, _ = self.locks.pop(i)
        self.tree.unlock(node)

    @rule(num_tokens=st.integers(0, 45))
    def evict(self, num_tokens):
        self.do_evict(num_tokens)

    @rule()
    def reset(self):
        if self.tree.protected_size():
            with pytest.raises(RuntimeError):
                self.tree.reset()
            return
        self.slots.free(as_ints(self.tree.reset()))
        self.cached.clear()

    @invariant()
    def tree_matches_model(self):
        self.tree.check()
        contents = tree_contents(self.tree)
        assert contents == self.cached
        for ns, prefix in self.cached:
            assert len(prefix) == 1 or (ns, prefix[:-1]) in self.cached, "eviction left a hole"
        protected = sum(self.is_protected(p) for p in self.cached)
        assert self.tree.protected_size() == protected
        assert self.tree.evictable_size() == len(self.cached) - protected
        for node, ns, prefix in self.locks:
            assert tuple(path_key(node)) == prefix
            assert not prefix or namespace_of(node) == ns
        held = {ns for ns, _ in self.cached if ns is not None}
        assert {n for n in self.tree.root.children if isinstance(n, str)} == held

    @invariant()
    def slots_conserved(self):
        tree_slots = list(tree_contents(self.tree).values())
        assert len(tree_slots) == len(set(tree_slots)) == self.tree.total_size()
        assert not self.slots.free_set.intersection(tree_slots), "slot both free and cached"
        assert len(self.slots.free_slots) + self.tree.total_size() == self.slots.capacity


class TreeVsModelTensors(TreeVsModel):
    use_tensors = True


TestTreeVsModel = TreeVsModel.TestCase
TestTreeVsModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestTreeVsModelTensors = TreeVsModelTensors.TestCase
TestTreeVsModelTensors.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


# ---- focused unit tests ----


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([1, 2, 3], [1, 2]) == 2
    assert common_prefix_len([1, 2], [9, 1, 2, 7], 1) == 2
    assert common_prefix_len([1, 2], [9, 1, 3], 1) == 1
    assert common_prefix_len([5], [1]) == 0
    assert common_prefix_len([1], [1], 1) == 0


def test_match_splits_in_the_middle_of_a_node():
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15]) == 0
    result = tree.match_prefix([1, 2, 3, 9])
    assert result.length == 3
    assert result.values == [[10, 11, 12]]
    assert result.last_node.key == [1, 2, 3]
    assert list(tree.root.children) == [1]
    upper = tree.root.children[1]
    assert upper is result.last_node
    assert list(upper.children) == [4]
    assert upper.children[4].key == [4, 5, 6]
    assert upper.children[4].value == [13, 14, 15]
    assert tree.total_size() == 6
    tree.check()


def test_insert_returns_cached_length_and_splits():
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4], [10, 11, 12, 13]) == 0
    assert tree.insert([1, 2, 7], [20, 21, 22]) == 2  # caller frees 20, 21
    assert tree.total_size() == 5
    assert tree.insert([1, 2, 3], [30, 31, 32]) == 3  # fully cached: all duplicates
    assert tree.total_size() == 5
    assert tree.match_prefix([1, 2, 7]).values == [[10, 11], [22]]
    assert tree.match_prefix([1, 2, 3, 4, 5]).values == [[10, 11], [12], [13]]
    tree.check()


def test_split_keeps_locks_on_both_parts():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13])
    full = tree.match_prefix([1, 2, 3, 4]).last_node
    tree.lock(full)
    assert tree.protected_size() == 4
    partial = tree.match_prefix([1, 2, 9]).last_node  # splits the locked node
    assert partial.lock_ref == 1 and full.lock_ref == 1
    assert path_key(full) == [1, 2, 3, 4]
    assert tree.protected_size() == 4
    tree.check()
    tree.unlock(full)
    assert tree.evictable_size() == 4 and tree.protected_size() == 0
    tree.check()


def test_locked_nodes_are_never_evicted():
    tree = RadixTree()
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([1, 2, 4], [20, 21, 22])
    tree.insert([5, 6], [30, 31])
    locked = tree.match_prefix([1, 2, 3]).last_node
    tree.lock(locked)
    evicted = tree.evict(100)
    assert sorted(as_ints(evicted)) == [22, 30, 31]
    assert tree.evictable_size() == 0 and tree.protected_size() == 3
    assert tree.match_prefix([1, 2, 3]).length == 3
    assert tree.evict(1) == []
    tree.unlock(locked)
    assert sorted(as_ints(tree.evict(100))) == [10, 11, 12]
    assert tree.total_size() == 0
    tree.check()


def test_evicts_least_recently_used_first():
    tree = RadixTree()
    tree.insert([1, 1], [10, 11])
    tree.insert([2, 2], [20, 21])
    tree.insert([3, 3], [30, 31])
    tree.match_prefix([1, 1])  # [2, 2] is now the oldest
    assert tree.evict(1) == [[20, 21]]
    assert tree.evict(2) == [[30, 31]]
    assert tree.evict(2) == [[10, 11]]
    tree.check()


def test_parent_left_childless_is_evicted_in_the_same_call():
    tree = RadixTree()
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([1, 2, 4], [20, 21, 22])
    evicted = tree.evict(4)
    assert len(evicted) == 3 and evicted[-1] == [10, 11]
    assert tree.total_size() == 0
    tree.check()


def test_evict_stops_once_enough_is_freed():
    tree = RadixTree()
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([4, 5, 6], [20, 21, 22])
    assert tree.evict(0) == []
    assert len(tree.evict(1)) == 1
    assert tree.total_size() == 3
    tree.check()


def test_lock_misuse_raises():
    tree = RadixTree()
    tree.insert([1, 2], [10, 11])
    node = tree.match_prefix([1, 2]).last_node
    with pytest.raises(AssertionError):
        tree.unlock(node)
    tree.evict(2)
    with pytest.raises(AssertionError):
        tree.lock(node)
    tree.lock(tree.root)  # the root is never locked: a no-op
    tree.unlock(tree.root)
    tree.check()


def test_reset():
    tree = RadixTree()
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([1, 4], [20, 21])
    root = tree.root
    tree.lock(root)  # what a request with no cached prefix holds
    node = tree.match_prefix([1, 4]).last_node
    tree.lock(node)
    with pytest.raises(RuntimeError):
        tree.reset()
    tree.unlock(node)
    assert sorted(as_ints(tree.reset())) == [10, 11, 12, 21]
    assert tree.total_size() == 0 and tree.match_prefix([1, 2]).length == 0
    assert tree.root is root
    tree.unlock(root)
    tree.check()


def test_disabled_tree_stores_nothing():
    tree = RadixTree(disabled=True)
    assert tree.insert([1, 2, 3], [10, 11, 12]) == 0
    result = tree.match_prefix([1, 2, 3])
    assert result.length == 0 and result.values == [] and result.last_node is tree.root
    assert tree.total_size() == tree.evictable_size() == tree.protected_size() == 0
    assert tree.evict(10) == []
    tree.check()


def test_value_length_mismatch_is_rejected():
    with pytest.raises(ValueError):
        RadixTree().insert([1, 2, 3], [10, 11])


def test_tensor_values_and_keys():
    tree = RadixTree()
    slots = torch.arange(100, 106)  # [6]
    assert tree.insert(torch.tensor([1, 2, 3, 4, 5, 6]), slots) == 0
    assert tree.insert((1, 2, 3, 9), torch.tensor([200, 201, 202, 203])) == 3
    result = tree.match_prefix(torch.tensor([1, 2, 3, 4, 7]))
    assert result.length == 4
    assert all(isinstance(v, torch.Tensor) for v in result.values)
    assert torch.cat(result.values).tolist() == [100, 101, 102, 103]
    tree.check()
    evicted = tree.evict(100)
    assert sorted(torch.cat(evicted).tolist()) == [100, 101, 102, 103, 104, 105, 203]
    tree.check()


def test_long_keys():
    tree = RadixTree()
    base = list(range(5000))
    tree.insert(base, list(range(5000)))
    for cut in (4999, 2500, 1000, 1):
        key = base[:cut] + [-1] * 10
        assert tree.insert(key, list(range(10_000, 10_000 + len(key)))) == cut
    result = tree.match_prefix(base + [7])
    assert result.length == 5000 and as_ints(result.values) == list(range(5000))
    tree.check()


def test_pretty_lists_nodes():
    tree = RadixTree()
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([1, 2, 4] + list(range(20)), list(range(23)))
    text = tree.pretty()
    assert "[1, 2]" in text and "[3]" in text and "+13" in text
    assert len(text.splitlines()) == 4


def test_import_does_not_pull_in_torch():
    code = "import sys, radixflow.radix_cache; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- namespaces (cache_salt) ----


def test_namespaces_never_share_prefixes():
    tree = RadixTree()
    tree.insert([1, 2, 3], [10, 11, 12])
    assert tree.match_prefix([1, 2, 3], namespace="a").length == 0
    assert tree.insert([1, 2, 3], [20, 21, 22], namespace="a") == 0  # not a duplicate
    assert tree.insert([1, 2, 4], [30, 31, 32], namespace="b") == 0
    assert as_ints(tree.match_prefix([1, 2, 3], namespace="a").values) == [20, 21, 22]
    assert as_ints(tree.match_prefix([1, 2, 3]).values) == [10, 11, 12]
    assert tree.match_prefix([1, 2, 3], namespace="b").length == 2
    assert tree.match_prefix([1, 2], namespace="c").last_node is tree.root
    assert tree.total_size() == 9 and tree.evictable_size() == 9
    a = tree.root.children["a"]
    assert a.namespace == "a" and a.key == [] and namespace_of(a.children[1]) == "a"
    tree.check()


def test_a_namespace_does_not_collide_with_a_token_and_refuses_non_strings():
    tree = RadixTree()
    tree.insert([7], [70])
    tree.insert([7], [71], namespace="7")
    assert as_ints(tree.match_prefix([7]).values) == [70]
    with pytest.raises(TypeError):
        tree.insert([7], [72], namespace=7)
    tree.check()


def test_locks_and_lru_eviction_span_namespaces_and_empty_ones_go():
    tree = RadixTree()
    tree.insert([1, 2], [10, 11], namespace="a")
    tree.insert([1, 2], [20, 21])
    tree.insert([3], [30], namespace="b")
    locked = tree.match_prefix([1, 2], namespace="a").last_node
    tree.lock(locked)
    assert tree.root.children["a"].lock_ref == 1 and tree.protected_size() == 2
    tree.check()
    assert tree.evict(1) == [[20, 21]]  # the oldest unlocked leaf, in any namespace
    assert as_ints(tree.evict(5)) == [30] and "b" not in tree.root.children
    tree.check()
    tree.unlock(locked)
    assert as_ints(tree.evict(5)) == [10, 11] and tree.root.children == {}
    tree.check()


def test_reset_and_pretty_with_namespaces():
    tree = RadixTree()
    tree.insert([1, 2], [10, 11], namespace="tenant-secret")
    text = tree.pretty()
    assert "ns:" in text and "tenant-secret" not in text
    assert sorted(as_ints(tree.reset())) == [10, 11] and tree.root.children == {}
    tree.check()


def test_split_inside_a_namespace():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13], namespace="a")
    node = tree.match_prefix([1, 2, 9], namespace="a").last_node
    assert node.key == [1, 2] and node.parent is tree.root.children["a"]
    assert tree.insert([1, 2, 5], [20, 21, 22], namespace="a") == 2
    tree.check()
