"""The routing policy (runtime/balance/policy.py) and its approximate prefix tree."""

from __future__ import annotations

import random

import pytest

from radixflow.runtime.balance.config import PolicyConfig
from radixflow.runtime.balance.policy import LoadBalancer, NoWorker
from radixflow.runtime.balance.prefix_tree import PrefixTree, common_prefix_len, token_key


def balancer(method: str = "cache_aware", workers=("a", "b", "c"), **config) -> LoadBalancer:
    return LoadBalancer(workers, PolicyConfig(method=method, **config))


# -- prefix tree ---------------------------------------------------------------------------


def test_common_prefix_len():
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len("abc", "abc") == 3
    assert common_prefix_len("abcd", "abxd") == 2
    rng = random.Random(0)
    for _ in range(200):
        a = "".join(rng.choice("ab") for _ in range(rng.randint(0, 30)))
        b = "".join(rng.choice("ab") for _ in range(rng.randint(0, 30)))
        expect = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix_len(a, b) == expect


def test_tree_match_is_each_tenants_longest_prefix():
    tree = PrefixTree(["a", "b"])
    tree.insert("hello world", "a")
    tree.insert("hello there", "b")
    tree.insert("help", "b")
    assert tree.match("hello world, again") == {"a": 11, "b": 6}
    assert tree.match("hello there") == {"a": 6, "b": 11}
    assert tree.match("helping") == {"a": 3, "b": 4}
    assert tree.match("xyz") == {}
    assert tree.size("a") == len("hello world")
    assert tree.size("b") == len("hello") + len(" there") + len("p")


def test_tree_sizes_count_each_tenants_characters_once():
    tree = PrefixTree()
    for text in ["abc", "abd", "abc", "ab", "abcdef"]:
        tree.insert(text, "t")
    assert tree.size("t") == len("abcdef") + 1  # ab + c + def + d


def test_tree_random_against_brute_force():
    rng = random.Random(1)
    tree = PrefixTree()
    sent: dict[str, list[str]] = {"x": [], "y": [], "z": []}
    for _ in range(300):
        tenant = rng.choice("xyz")
        text = "".join(rng.choice("abc") for _ in range(rng.randint(1, 12)))
        tree.insert(text, tenant)
        sent[tenant].append(text)
        query = "".join(rng.choice("abc") for _ in range(rng.randint(0, 14)))
        expect = {t: max(common_prefix_len(q, query) for q in texts)
                  for t, texts in sent.items() if texts}
        assert tree.match(query) == {t: n for t, n in expect.items() if n > 0}
    for tenant, texts in sent.items():
        distinct_prefixes = {t[:i] for t in texts for i in range(1, len(t) + 1)}
        assert tree.size(tenant) == len(distinct_prefixes)


def test_tree_remove_tenant_and_clear():
    tree = PrefixTree()
    tree.insert("shared prefix one", "a")
    tree.insert("shared prefix two", "b")
    tree.remove_tenant("a")
    assert tree.match("shared prefix one") == {"b": len("shared prefix t") - 1}
    assert "a" not in tree.tenant_chars
    tree.clear()
    assert tree.match("shared prefix two") == {}
    assert tree.size("b") == 0


def test_tree_evicts_least_recently_used_leaves_down_to_the_limit():
    tree = PrefixTree()
    tree.insert("old conversation " * 4, "a")
    tree.insert("new conversation " * 4, "a")
    tree.insert("old conversation " * 4, "b")
    tree.evict(max_size=80)
    assert tree.size("a") <= 80
    assert tree.match("new conversation " * 4)["a"] == 68  # the recent one stays
    assert tree.match("old conversation " * 4).get("a", 0) < 68
    assert tree.match("old conversation " * 4)["b"] == 68  # another tenant's is untouched


def test_token_key_round_trips_ids():
    ids = [0, 1, 65, 50000, 151643]
    assert [ord(c) for c in token_key(ids)] == ids


# -- policies ------------------------------------------------------------------------------


def test_cache_aware_picks_the_longest_prefix_match():
    lb = balancer()
    system_a, system_b = "You are a pirate. " * 10, "You are a poet. " * 10
    first_a = lb.select(system_a + "hi")
    first_b = lb.select(system_b + "hi")
    assert first_a != first_b  # no match: the smallest tree, so a new worker
    for i in range(5):
        assert lb.select(system_b + f"question {i}") == first_b
        assert lb.select(system_a + f"question {i}") == first_a
    assert lb.cache_routed[first_a] == 5


def test_cache_aware_below_threshold_takes_the_smallest_tree_then_least_loaded():
    lb = balancer(cache_threshold=0.5)
    lb.select("abcdefgh" * 4)  # -> a (all empty, equal loads: the first)
    assert lb.tree.size("a") == 32
    # Shares 8 of 40 characters with a's prompt: below the threshold, so not a.
    second = lb.select("abcdefgh" + "x" * 32)
    assert second == "b"  # b and c have empty trees and no load; b is listed first
    lb.done("a")
    lb.done("b")
    lb.assign("b")  # b is busy now; c's tree (empty) is the smallest anyway
    assert lb.select("zzzz" * 10) == "c"
    # Equal trees: the less loaded one.
    lb2 = balancer(workers=("p", "q"))
    lb2.assign("p")
    assert lb2.select("fresh prompt") == "q"


def test_cache_aware_threshold_is_a_ratio():
    lb = balancer(cache_threshold=0.8)
    lb.select("0123456789")  # a
    # 7 of 10 characters match a: 0.7 <= 0.8, so the smallest tree.
    assert lb.select("0123456xyz") == "b"
    lb2 = balancer(cache_threshold=0.6)
    lb2.select("0123456789")
    assert lb2.select("0123456xyz") == "a"  # 0.7 > 0.6


def test_cache_aware_imbalance_goes_to_the_least_loaded():
    lb = balancer(workers=("a", "b"), balance_abs_threshold=4, balance_rel_threshold=1.5)
    prompt = "the same long prompt " * 5
    assert lb.select(prompt) == "a"
    for _ in range(4):  # a gets all of them: loads 5 vs 0, but 5 - 0 > 4 only from now on
        assert lb.select(prompt) == "a"
    assert lb.load == {"a": 5, "b": 0}
    assert lb.select(prompt) == "b"  # imbalanced: the prefix match is ignored
    # Both conditions: an absolute gap alone is not enough.
    for rel, expect in ((10.0, "a"), (1.5, "b")):
        lb2 = balancer(workers=("a", "b"), balance_abs_threshold=2, balance_rel_threshold=rel)
        assert lb2.select(prompt) == "a"
        for _ in range(7):
            lb2.assign("a")
        for _ in range(3):
            lb2.assign("b")
        # Loads 8 and 3: 8 - 3 > 2, and 8 > 3 * rel only for rel 1.5.
        assert lb2.select(prompt) == expect


def test_round_robin_cycles_and_skips_excluded():
    lb = balancer("round_robin")
    assert [lb.select() for _ in range(5)] == ["a", "b", "c", "a", "b"]
    assert lb.select(exclude={"c"}) == "a"
    with pytest.raises(NoWorker):
        lb.select(exclude={"a", "b", "c"})


def test_shortest_queue_takes_the_fewest_in_flight():
    lb = balancer("shortest_queue")
    assert lb.select() == "a"
    assert lb.select() == "b"
    assert lb.select() == "c"
    lb.done("b")
    assert lb.select() == "b"
    lb.done("a")
    lb.done("c")
    # Loads a=0, b=1, c=0; a and c tie on load and on requests routed: the first listed.
    assert lb.select() == "a"
    assert lb.load == {"a": 1, "b": 1, "c": 0}


def test_removed_workers_are_never_picked_and_flush_clears_trees():
    lb = balancer()
    prompt = "cached prompt " * 10
    owner = lb.select(prompt)
    lb.remove_worker(owner)
    assert lb.select(prompt) != owner
    lb.clear_cache()
    assert all(lb.tree.size(w) == 0 for w in lb.workers)
    lb.add_worker(owner)
    assert owner in lb.workers


@pytest.mark.parametrize("bad, flag", [
    ({"method": "random"}, "--load-balance-method"),
    ({"cache_threshold": 1.5}, "--cache-threshold"),
    ({"balance_abs_threshold": -1}, "--balance-abs-threshold"),
    ({"balance_rel_threshold": 0.9}, "--balance-rel-threshold"),
    ({"max_tree_size": 0}, "--max-tree-size"),
])
def test_bad_config_names_the_flag(bad, flag):
    with pytest.raises(ValueError, match=flag):
        PolicyConfig(**bad)
