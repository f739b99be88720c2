"""/dashboard without a browser: its page files, the JSON it polls (/dashboard/state) against
the session's real server, the query's 400s, and the charts' history ring."""

from __future__ import annotations

import pytest
import requests

from radixflow.runtime.server.dashboard_history import DashboardHistory
from radixflow.runtime.server.dashboard_routes import MAX_NODES_LIMIT

SYSTEM = ("You are the dashboard test's assistant. Answer in one short sentence, be precise, "
          "and never mention the weather or the time of day.")


def _state(server, **params) -> dict:
    r = requests.get(server.url + "/dashboard/state", params=params, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    return r.json()


@pytest.mark.parametrize("path, media", [("/dashboard", "text/html"),
                                         ("/dashboard/app.js", "text/javascript"),
                                         ("/dashboard/app.css", "text/css")])
def test_the_page_files_are_served_with_a_strict_policy(server, path, media):
    r = requests.get(server.url + path, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith(media)
    policy = r.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert r.headers["x-content-type-options"] == "nosniff"


def test_the_state_shows_a_shared_system_prompt_as_one_node_with_its_hits(server, client):
    for question in ("What is two plus two?", "Name a colour.", "Spell cat backwards."):
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    state = _state(server, max_nodes=MAX_NODES_LIMIT)
    assert state["model"] == "tiny" and state["dp_size"] == 1
    (replica,) = state["replicas"]
    assert replica["dp_rank"] == 0 and replica["kv_total_tokens"] > 0
    assert replica["kv_free_tokens"] <= replica["kv_total_tokens"]
    assert replica["tree_tokens"] >= replica["evictable_tokens"] >= 0
    nodes = {n["id"]: n for n in replica["nodes"]}
    assert nodes[0]["parent"] is None
    # The three prompts share everything up to the user's turn: one node holds that prefix,
    # reused by the second and third requests; each question hangs under it as its own child.
    shared = [n for n in nodes.values() if "dashboard test's assistant" in n["text"]]
    assert len(shared) == 1, shared
    (node,) = shared
    assert node["hits"] >= 2 and node["tokens"] > 20
    kids = [n for n in nodes.values() if n["parent"] == node["id"]]
    assert len(kids) >= 3
    assert all(n["parent"] in nodes for n in nodes.values() if n["id"] != 0)
    assert state["history"]["points"] and sum(p["requests"] for p in state["history"]["points"])


def test_the_state_is_bounded_by_max_nodes(server, client):
    client.completions.create(model="tiny", prompt="one two three", max_tokens=2)
    state = _state(server, max_nodes=1)
    (replica,) = state["replicas"]
    assert len(replica["nodes"]) == 1 and replica["truncated"] is True


@pytest.mark.parametrize("query, needle", [
    ({"max_nodes": "0"}, "max_nodes must be from 1"),
    ({"max_nodes": str(MAX_NODES_LIMIT + 1)}, f"from 1 to {MAX_NODES_LIMIT}"),
    ({"max_nodes": "ten"}, "max_nodes must be an integer"),
    ({"max_nodes": "9" * 40}, "max_nodes must be an integer"),
    ({"depth": "3"}, "unknown query parameter 'depth'"),
])
def test_bad_queries_are_400s_naming_the_parameter(server, query, needle):
    r = requests.get(server.url + "/dashboard/state", params=query, timeout=30)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_the_history_buckets_tokens_and_latencies_by_time():
    class Stats:
        generation_tokens = 0
        prompt_tokens = 0

    now = [1000.0]
    stats = Stats()
    history = DashboardHistory(lambda: stats, bucket_s=5.0, num_buckets=4,
                               clock=lambda: now[0])
    history.sample()  # the baseline: tokens before the first sample are not credited
    stats.generation_tokens, stats.prompt_tokens = 50, 200
    history.request_finished(0.2, 0.01)
    history.request_finished(0.4, None)
    now[0] += 5.0
    stats.generation_tokens = 60
    series = history.series()
    assert series["bucket_s"] == 5.0 and len(series["points"]) == 4
    older, latest = series["points"][-2], series["points"][-1]
    assert older["requests"] == 2 and older["generation_tokens_per_s"] == 10.0
    assert older["prompt_tokens_per_s"] == 40.0
    assert older["ttft_ms"] == pytest.approx(300.0) and older["tpot_ms"] == pytest.approx(10.0)
    assert latest["requests"] == 0 and latest["generation_tokens_per_s"] == 2.0
    assert latest["ttft_ms"] is None and latest["tpot_ms"] is None
    assert [p["t"] for p in series["points"]] == [990.0, 995.0, 1000.0, 1005.0]
    now[0] += 100.0  # past the ring: the old buckets are gone, empty points remain
    assert all(p["requests"] == 0 for p in history.series()["points"])


def test_the_grammar_cache_shows_once_a_constraint_compiled(server, client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    for _ in range(2):
        client.chat.completions.create(model="tiny", max_tokens=8, response_format=fmt,
                                       messages=[{"role": "user", "content": "A number."}])
    (replica,) = _state(server, max_nodes=1)["replicas"]
    grammar = replica["grammar"]
    assert grammar["entries"] >= 1 and grammar["compiles"] >= 1 and grammar["hits"] >= 1
    assert grammar["num_masked_rows"] > 0
