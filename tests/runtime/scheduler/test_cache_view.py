"""cache_view (the /dashboard's JSON of one scheduler) on a fake runner: hits on a shared
prefix, the requests that hold nodes while they run, the bound on nodes, evictions, and the
grammar cache only once a constraint built it."""

from __future__ import annotations

import time

from helpers.fake_runner import CharTokenizer, FakeRunner, fake_scheduler, generate, run_to_idle

from radixflow.runtime.scheduler.cache_view import cache_view

SHARED = list(range(2, 30))


def _nodes(view: dict) -> dict[int, dict]:
    return {n["id"]: n for n in view["nodes"]}


def test_a_shared_prefix_is_one_node_that_counts_its_reuses():
    sched = fake_scheduler()
    began = time.time()
    for i in range(3):
        run_to_idle(sched, generate(f"r{i}", SHARED + [40 + i, 50 + i], max_new_tokens=2))
    view = cache_view(sched.state, 64)
    used = [n["last_access"] for n in view["nodes"] if n["id"] != 0]
    assert all(began <= t <= view["time"] for t in used)  # when, not just in which order
    nodes = _nodes(view)
    (shared,) = [n for n in nodes.values() if n["parent"] == 0]
    assert shared["tokens"] == len(SHARED) and shared["hits"] == 2
    assert shared["text"] == CharTokenizer().decode(SHARED)
    kids = [n for n in nodes.values() if n["parent"] == shared["id"]]
    assert len(kids) == 3 and all(n["hits"] == 0 for n in kids)
    assert sum(n["tokens"] for n in nodes.values()) == view["tree_tokens"]
    assert view["evictable_tokens"] == view["tree_tokens"]  # nothing running holds a node
    assert view["requests"] == [] and view["truncated"] is False
    assert view["grammar"] is None  # no constraint yet: the view does not build the backend
    assert sched.grammars.built_backend is None


def test_a_running_request_is_listed_and_holds_its_nodes():
    sched = fake_scheduler()
    run_to_idle(sched, generate("first", SHARED + [40], max_new_tokens=2))
    sched.step([generate("live", SHARED + [41], max_new_tokens=50)])
    sched.step([])
    view = cache_view(sched.state, 64)
    (req,) = view["requests"]
    assert req["rid"] == "live" and req["phase"] in ("prefilling", "running")
    assert req["cached_tokens"] >= len(SHARED)
    held = [n for n in view["nodes"] if "live" in n["requests"]]
    assert held and all(n["locks"] >= 1 for n in held)
    assert view["evictable_tokens"] < view["tree_tokens"]


def test_the_view_is_bounded_and_counts_evictions():
    sched = fake_scheduler(FakeRunner(num_slots=64))
    for i in range(6):
        run_to_idle(sched, generate(f"r{i}", [2 + i] + list(range(10, 30)), max_new_tokens=4))
    view = cache_view(sched.state, 2)
    assert len(view["nodes"]) == 2 and view["truncated"] is True
    assert view["evicted_tokens"] > 0
    assert view["kv_total_tokens"] == 64
    assert view["kv_free_tokens"] + view["tree_tokens"] == 64
