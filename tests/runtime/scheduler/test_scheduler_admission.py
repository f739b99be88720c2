"""Admission and prefill (scheduler/prefill.py, admission.py) on a fake runner: which waiting
requests enter a batch under the request, token and KV budgets, chunking, cached prefixes, the
prefill budget while others decode, and the requests refused at intake."""

from __future__ import annotations

from helpers.fake_runner import (
    FakeRunner,
    collect,
    expected,
    fake_scheduler,
    generate,
    run_to_idle,
)

from radixflow.runtime.forward_batch import ForwardMode
from radixflow.runtime.scheduler.req import ReqStatus


def extends(runner: FakeRunner):
    return [c for c in runner.calls if c.mode == ForwardMode.EXTEND]


def test_plan_changes_nothing_and_admits_up_to_max_running_requests():
    sched = fake_scheduler(FakeRunner(max_running=2))
    for i in range(4):
        sched.intake.add(generate(f"r{i}", [10 + i, 20, 30], max_new_tokens=3))
    plans = sched.prefill.plan()
    assert [p.req.rid for p in plans] == ["r0", "r1"]  # arrival order among equal matches
    assert all(r.status == ReqStatus.WAITING for r in sched.waiting) and len(sched.waiting) == 4
    sched.prefill.run()
    assert [r.rid for r in sched.running] == ["r0", "r1"]
    assert [r.rid for r in sched.waiting] == ["r2", "r3"]
    got = run_to_idle(sched)
    assert {rid: g.ids for rid, g in got.items()} == {
        f"r{i}": expected([10 + i, 20, 30], 3) for i in range(4)}


def test_a_long_prompt_is_computed_in_chunks():
    runner = FakeRunner()
    sched = fake_scheduler(runner, chunked_prefill_size=4)
    prompt = list(range(2, 12))
    sched.step([generate("long", prompt, max_new_tokens=2)])
    assert sched.by_rid["long"].status == ReqStatus.PREFILLING
    got = run_to_idle(sched)
    assert [c.num_tokens for c in extends(runner)] == [4, 4, 2]
    assert got["long"].ids == expected(prompt, 2)


def test_a_cached_prefix_is_not_computed_again():
    runner = FakeRunner()
    sched = fake_scheduler(runner)
    prompt = list(range(2, 42))
    run_to_idle(sched, generate("first", prompt, max_new_tokens=2))
    runner.reset_calls()
    got = run_to_idle(sched, generate("again", prompt + [50, 51], max_new_tokens=2))
    (extend,) = extends(runner)
    assert got["again"].outputs[-1].cached_tokens >= len(prompt)
    assert extend.num_tokens == 42 - got["again"].outputs[-1].cached_tokens
    assert got["again"].ids == expected(prompt + [50, 51], 2)


def test_a_request_sharing_an_uncached_prefix_waits_for_it_to_be_cached():
    runner = FakeRunner()
    sched = fake_scheduler(runner)
    shared = list(range(2, 50))  # longer than admission.IN_BATCH_SHARE_THRESHOLD
    sched.intake.add(generate("a", shared + [60], max_new_tokens=1))
    sched.intake.add(generate("b", shared + [61], max_new_tokens=1))
    assert [p.req.rid for p in sched.prefill.plan()] == ["a"]
    got = run_to_idle(sched)
    assert got["b"].outputs[-1].cached_tokens == len(shared)
    assert [c.num_tokens for c in extends(runner)] == [49, 1]


def test_admission_waits_for_kv_the_whole_prompt_needs():
    runner = FakeRunner(num_slots=24)
    sched = fake_scheduler(runner, disable_radix_cache=True)
    got = collect(sched.step([generate("a", list(range(2, 16)), max_new_tokens=4),
                              generate("b", list(range(20, 34)), max_new_tokens=4)]), {})
    assert [r.rid for r in sched.running] == ["a"] and [r.rid for r in sched.waiting] == ["b"]
    got = run_to_idle(sched, got=got)
    assert got["a"].ids == expected(list(range(2, 16)), 4)
    assert got["b"].ids == expected(list(range(20, 34)), 4)
    assert sched.num_retractions == 0


def test_while_others_decode_a_step_prefills_at_most_the_prefill_budget():
    runner = FakeRunner()
    sched = fake_scheduler(runner, prefill_budget_while_decoding=8)
    sched.step([generate("stream", [2, 3, 4], max_new_tokens=20)])
    runner.reset_calls()
    prompt = list(range(30, 58))  # shares no prefix with the stream's
    sched.step([generate("long", prompt, max_new_tokens=2)])
    assert [c.num_tokens for c in extends(runner)] == [8]
    got = run_to_idle(sched)
    assert [c.num_tokens for c in extends(runner)] == [8, 8, 8, 4]
    assert got["long"].ids == expected(prompt, 2)


def test_intake_refuses_what_cannot_run():
    sched = fake_scheduler(FakeRunner(context_len=16))
    got = run_to_idle(sched, generate("empty", []), generate("long", list(range(2, 18))),
                      generate("vocab", [2, 64]), generate("ok", [2], max_new_tokens=1))
    for rid, says in {"empty": "empty", "long": "context is 16", "vocab": "vocabulary"}.items():
        finish = got[rid].finish
        assert finish.type == "abort" and finish.status_code == 400, rid
        assert says in finish.message, finish.message
    assert got["ok"].ids == [3]
