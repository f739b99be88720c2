"""`radixflow serve --dp-size 2`: two scheduler replicas behind one HTTP server.

Outputs equal one replica's, requests spread over the replicas, prompts that share a prefix
go to the replica that has it cached (cache_aware), and aborts, flush, health, stats and
/metrics cover every replica. Bad flags are start-up errors naming them.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time

import pytest
import requests
from helpers.live_server import descendants, wait_gone

from radixflow.runtime.server.process import ServerProcess

KV_POOL_TOKENS = 4096  # as the dp 1 server of conftest.py
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):", "Numbers: 1 2 3",
           "user: Hello! How are", "Please answer in JSON:", "A small model reads",
           "What is the capital of Italy?"]


@pytest.fixture(scope="module")
def dp_server(tiny_model_dir):
    rt = ServerProcess(str(tiny_model_dir), dp_size=2, max_total_tokens=KV_POOL_TOKENS,
                       max_running_requests=16, served_model_name="tiny", log_level="warning",
                       start_timeout=300)
    children = descendants(rt.proc.pid)
    yield rt
    assert rt.shutdown() == 0
    assert not wait_gone(children), "replica processes outlived the server"


def generate(server, text, sampling=GREEDY, **extra):
    r = requests.post(server.url + "/generate",
                      json={"text": text, "sampling_params": sampling, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=30).json()


def routed(server) -> list[int]:
    return [r["routed_requests"] for r in info(server)["replicas"]]


def wait_replicas_idle(server, timeout: float = 60.0) -> list[dict]:
    """Each replica's fresh stats once nothing runs and no request is in flight."""
    t0 = time.time()
    deadline = time.monotonic() + timeout
    got: dict = {}
    while time.monotonic() < deadline:
        got = info(server)
        replicas = got["replicas"]
        if (got.get("stats_time", 0) > t0 + 0.6 and got["num_pending_requests"] == 0
                and all(r.get("num_running") == 0 and r.get("num_waiting") == 0
                        and r["load"] == 0 for r in replicas)):
            return replicas
        time.sleep(0.2)
    raise AssertionError(f"replicas not idle after {timeout} s: {got}")


def test_processes_and_info(dp_server):
    got = info(dp_server)
    assert got["dp_size"] == 2 and got["load_balance_method"] == "cache_aware"
    assert {"scheduler-0", "scheduler-1", "detokenizer", "http"} <= set(got["processes"])
    assert [r["dp_rank"] for r in got["replicas"]] == [0, 1]
    assert requests.get(dp_server.url + "/health", timeout=30).status_code == 200
    assert requests.get(dp_server.url + "/health_generate", timeout=60).status_code == 200


def test_greedy_outputs_equal_one_replicas(server, dp_server):
    """Sequentially and all at once: the same text as the dp 1 server, on either replica."""
    expect = [generate(server, p)["text"] for p in PROMPTS]
    assert [generate(dp_server, p)["text"] for p in PROMPTS] == expect
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: generate(dp_server, p)["text"], PROMPTS))
    assert got == expect
    batch = requests.post(dp_server.url + "/generate",
                          json={"text": PROMPTS, "sampling_params": GREEDY}, timeout=120).json()
    assert [b["text"] for b in batch] == expect


def test_distinct_prompts_spread_over_replicas(dp_server):
    requests.post(dp_server.url + "/flush_cache", timeout=60)  # empty routing trees
    before = routed(dp_server)
    for i, p in enumerate(PROMPTS):
        generate(dp_server, f"{i} {p} {i}")  # no prefix in common: the smaller tree wins
    after = routed(dp_server)
    deltas = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(deltas) == len(PROMPTS)
    assert min(deltas) >= len(PROMPTS) // 4, deltas


def test_shared_prefix_goes_to_the_replica_that_has_it(dp_server):
    requests.post(dp_server.url + "/flush_cache", timeout=60)
    systems = ["You are a pirate who answers every question with a sea story. " * 3,
               "You are a careful librarian; cite the shelf of every book you name. " * 3]
    owners = []
    for system in systems:
        before = routed(dp_server)
        metas = [generate(dp_server, system + f"Question {i}: what next?")["meta_info"]
                 for i in range(4)]
        deltas = [a - b for a, b in zip(routed(dp_server), before, strict=True)]
        assert sorted(deltas) == [0, 4], deltas  # all four on one replica
        owners.append(deltas.index(4))
        assert metas[0]["cached_tokens"] == 0
        assert all(m["cached_tokens"] >= 40 for m in metas[1:]), metas
    assert owners[0] != owners[1]  # the second prefix went to the emptier replica
    replicas = wait_replicas_idle(dp_server)
    for rank in owners:
        assert replicas[rank]["cache_hit_tokens"] > 0 and replicas[rank]["cache_hit_rate"] > 0
        assert replicas[rank]["cache_routed_requests"] >= 3


def test_routed_dp_rank_overrides_the_cache_aware_choice(dp_server):
    """SGLang's routed_dp_rank: a request lands on the replica it names, even when the other
    one holds its prefix (so it computes that prefix anew there)."""
    requests.post(dp_server.url + "/flush_cache", timeout=60)
    system = "You are a terse assistant who answers in one word, always. " * 3
    before = routed(dp_server)
    generate(dp_server, system + "Question 0?")
    owner = [a - b for a, b in zip(routed(dp_server), before, strict=True)].index(1)
    other = 1 - owner
    before = routed(dp_server)
    metas = [generate(dp_server, system + f"Question {i}?", routed_dp_rank=other)["meta_info"]
             for i in (1, 2)]
    deltas = [a - b for a, b in zip(routed(dp_server), before, strict=True)]
    assert deltas[other] == 2 and deltas[owner] == 0, deltas
    assert metas[0]["cached_tokens"] == 0  # the prefix lived on the other replica only
    assert metas[1]["cached_tokens"] >= 40  # now it lives here too


def test_stream_and_abort_free_every_replica(dp_server):
    body = {"sampling_params": {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True},
            "stream": True}
    requests.post(dp_server.url + "/flush_cache", timeout=60)  # empty routing trees
    responses = []
    for p in PROMPTS[:4]:  # both replicas get some
        r = requests.post(dp_server.url + "/generate", json={"text": p, **body}, stream=True,
                          timeout=120)
        # NOTE: keep the line iterator: a dropped one closes the connection.
        lines = r.iter_lines()
        assert next(line for line in lines if line).startswith(b"data:")
        responses.append((r, lines))
    busy = info(dp_server)
    assert busy["num_pending_requests"] == 4
    assert sum(r["load"] for r in busy["replicas"]) == 4
    assert all(r["load"] > 0 for r in busy["replicas"]), busy["replicas"]
    for r, _ in responses:
        r.close()  # the client hangs up: the server aborts the request on its replica
    replicas = wait_replicas_idle(dp_server)
    assert all(r["kv_used_tokens"] == 0 for r in replicas)
    assert generate(dp_server, "still fine?")["meta_info"]["completion_tokens"] == 12


def test_flush_cache_reaches_every_replica(dp_server):
    text = "A prompt long enough to leave something in the radix cache. " * 2
    generate(dp_server, text)
    assert generate(dp_server, text)["meta_info"]["cached_tokens"] > 0
    wait_replicas_idle(dp_server)
    r = requests.post(dp_server.url + "/flush_cache", timeout=60)
    assert r.status_code == 200 and "flushed" in r.text.lower()
    assert all(rep["tree_chars"] == 0 for rep in info(dp_server)["replicas"])
    assert generate(dp_server, text)["meta_info"]["cached_tokens"] == 0


def test_metrics_per_replica(dp_server):
    text = requests.get(dp_server.url + "/metrics", timeout=30).text
    for name in ("radixflow:replica_load", "radixflow:replica_cache_hit_rate",
                 "radixflow:replica_routed_requests_total"):
        for rank in (0, 1):
            assert f'{name}{{dp_rank="{rank}",model_name="tiny"}}' in text, name
    assert "radixflow:prompt_tokens_total" in text  # the totals are still there


def test_openai_chat_on_replicas(dp_server, server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say something"}],
            "max_tokens": 8, "temperature": 0}
    outs = [requests.post(s.url + "/v1/chat/completions", json=body, timeout=120).json()
            for s in (server, dp_server)]
    assert outs[0]["choices"][0]["message"] == outs[1]["choices"][0]["message"]


def test_sessions_spread_over_replicas_and_continue_on_theirs(dp_server, server, tokenizer):
    """Each session opens on the replica with the fewest sessions; its requests follow it,
    so a continuation finds the history in that replica's cache."""
    url = dp_server.url
    sids = [requests.post(url + "/open_session", json={"capacity_of_str_len": 1000},
                          timeout=30).json() for _ in range(2)]
    before = routed(dp_server)
    firsts = [generate(dp_server, "Once upon a time", session_params={"id": sid})
              for sid in sids]
    assert [a - b for a, b in zip(routed(dp_server), before, strict=True)] == [1, 1]
    for sid, first in zip(sids, firsts, strict=True):
        more = generate(dp_server, " there was a robot",
                        session_params={"id": sid, "rid": first["meta_info"]["id"]})
        assert more["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"]
        ids = (tokenizer.encode("Once upon a time") + first["output_ids"]
               + tokenizer.encode(" there was a robot"))
        resent = requests.post(server.url + "/generate", timeout=120, json={
            "input_ids": ids, "sampling_params": GREEDY}).json()
        assert more["output_ids"] == resent["output_ids"]  # as one server answers the whole
        assert requests.post(url + "/close_session", json={"session_id": sid},
                             timeout=30).status_code == 200
        r = requests.post(url + "/generate", timeout=30, json={
            "text": "x", "sampling_params": GREEDY,
            "session_params": {"id": sid, "rid": first["meta_info"]["id"]}})
        assert r.status_code == 400 and "no open session" in r.text


def serve_error(*flags: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "radixflow.runtime.cli", "serve", *flags],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("flags, message", [
    (("--dp-size", "0"), "--dp-size must be > 0"),
    (("--dp-size", "2", "--load-balance-method", "random"), "--load-balance-method"),
    (("--dp-size", "2", "--cache-threshold", "1.5"), "--cache-threshold"),
    (("--balance-rel-threshold", "0.5"), "--balance-rel-threshold"),
    (("--balance-abs-threshold", "-3"), "--balance-abs-threshold"),
])
def test_bad_flags_are_startup_errors(flags, message):
    assert message in serve_error(*flags)


def test_engine_refuses_dp():
    from radixflow.runtime.server_args import server_args_from

    with pytest.raises(ValueError, match="dp_size > 1"):
        server_args_from(None, {"dp_size": 2}, who="Engine")
    assert server_args_from(None, {"dp_size": 2}, who="Runtime").dp_size == 2


def test_the_dashboard_state_has_every_replicas_tree_and_figures(dp_server):
    for text in PROMPTS[:4]:
        generate(dp_server, text)
    r = requests.get(dp_server.url + "/dashboard/state", timeout=60)
    assert r.status_code == 200, r.text
    state = r.json()
    assert state["dp_size"] == 2 and [s["dp_rank"] for s in state["replicas"]] == [0, 1]
    for replica in state["replicas"]:
        assert replica["nodes"][0]["id"] == 0 and replica["kv_total_tokens"] > 0
        assert "routed_requests" in replica["stats"]
    assert sum(s["stats"]["routed_requests"] for s in state["replicas"]) >= 4
    assert sum(s["tree_tokens"] for s in state["replicas"]) > 0
