"""cache_salt in the scheduler (a tenant's radix-tree namespace) on a fake runner: a prompt
cached under one salt is never reused under another nor unsalted, while requests of one salt
share it; the slot invariant holds through eviction across namespaces; a session keeps the
salt of its first request and refuses another."""

from __future__ import annotations

import msgspec
from helpers.fake_runner import FakeRunner, collect, expected, fake_scheduler, generate, run_to_idle

from radixflow.runtime.forward_batch import ForwardMode
from radixflow.runtime.messages import OpenSessionReq, SessionParams
from radixflow.runtime.scheduler.cache_view import cache_view

PROMPT = list(range(2, 34))


def extends(runner: FakeRunner):
    return [c for c in runner.calls if c.mode == ForwardMode.EXTEND]


def gen(rid: str, prompt: list[int], salt: str | None, **fields):
    msg = generate(rid, prompt, max_new_tokens=fields.pop("max_new_tokens", 3))
    return msgspec.structs.replace(msg, cache_salt=salt, **fields)


def cached(sched, msg) -> int:
    got = run_to_idle(sched, msg)
    assert got[msg.rid].ids == expected(list(msg.input_ids), 3)
    return got[msg.rid].outputs[-1].cached_tokens


def test_a_salt_reuses_only_its_own_prefixes():
    sched = fake_scheduler()
    assert cached(sched, gen("a1", PROMPT, "tenant-a")) == 0
    assert cached(sched, gen("b1", PROMPT, "tenant-b")) == 0
    assert cached(sched, gen("plain1", PROMPT, None)) == 0
    assert cached(sched, gen("a2", PROMPT + [40], "tenant-a")) >= len(PROMPT)
    assert cached(sched, gen("b2", PROMPT + [41], "tenant-b")) >= len(PROMPT)
    assert cached(sched, gen("plain2", PROMPT + [42], None)) >= len(PROMPT)
    root = sched.state.tree.root.children
    assert {k for k in root if isinstance(k, str)} == {"tenant-a", "tenant-b"}


def test_salted_requests_in_one_batch_share_within_their_salt():
    runner = FakeRunner()
    sched = fake_scheduler(runner)
    prompt = list(range(2, 50))  # longer than the in-batch sharing threshold
    msgs = [gen(f"{salt}{i}", prompt + [50 + i], salt, max_new_tokens=3)
            for i in range(2) for salt in ("x", "y")]
    got = run_to_idle(sched, *msgs)
    for msg in msgs:
        assert got[msg.rid].ids == expected(list(msg.input_ids), 3)
    hits = {msg.rid: got[msg.rid].outputs[-1].cached_tokens for msg in msgs}
    assert hits["x0"] == hits["y0"] == 0  # each salt's first computes the prefix itself
    assert hits["x1"] >= len(prompt) and hits["y1"] >= len(prompt)
    assert len(extends(runner)[0].parts) == 2  # x0 and y0 together: y0 waits for no one


def test_a_tight_pool_evicts_across_salts_and_keeps_every_slot():
    sched = fake_scheduler(FakeRunner(num_slots=72))
    got: dict = {}
    msgs = [gen(f"r{i}", PROMPT[: 20 + i], f"s{i % 3}", max_new_tokens=8) for i in range(9)]
    for msg in msgs:
        run_to_idle(sched, msg, got=got)  # check_slots after each: tree.check included
    for msg in msgs:
        assert got[msg.rid].ids == expected(list(msg.input_ids), 8)
    assert sched.state.tree.total_size() <= 72


def test_the_cache_view_marks_namespaces_without_the_salt():
    sched = fake_scheduler()
    run_to_idle(sched, gen("a", PROMPT, "secret-salt"))
    view = cache_view(sched.state, 64)
    spaces = [n for n in view["nodes"] if n.get("namespace")]
    assert len(spaces) == 1 and spaces[0]["tokens"] == 0
    assert "secret-salt" not in repr(view)
    assert sum(n["tokens"] for n in view["nodes"]) == sched.state.tree.total_size()


def test_a_session_keeps_the_salt_of_its_first_request():
    sched = fake_scheduler()
    sched.step([OpenSessionReq(session_id="s", capacity_of_str_len=100)])
    got = run_to_idle(sched, gen("t1", PROMPT[:10], "a", session=SessionParams(id="s")))
    assert got["t1"].finish.type == "length"
    for rid, salt in (("t2", "b"), ("t3", None)):
        got = run_to_idle(sched, gen(rid, [40, 41], salt,
                                     session=SessionParams(id="s", rid="t1")))
        finish = got[rid].finish
        assert finish.type == "abort" and finish.status_code == 400
        assert "cache_salt" in finish.message and "'b'" not in finish.message
    got = run_to_idle(sched, gen("t4", [40, 41], "a", session=SessionParams(id="s", rid="t1")))
    history = PROMPT[:10] + expected(PROMPT[:10], 3)
    assert got["t4"].ids == expected(history + [40, 41], 3)
    assert got["t4"].outputs[-1].cached_tokens >= len(history) - 1


def test_an_unsalted_session_refuses_a_salt():
    sched = fake_scheduler()
    out = collect(sched.step([OpenSessionReq(session_id="s", capacity_of_str_len=100)]), {})
    assert out == {}
    run_to_idle(sched, gen("t1", PROMPT[:10], None, session=SessionParams(id="s")))
    got = run_to_idle(sched, gen("t2", [40], "a", session=SessionParams(id="s", rid="t1")))
    assert got["t2"].finish.status_code == 400 and "no cache_salt" in got["t2"].finish.message
