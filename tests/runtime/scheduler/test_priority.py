"""Priority scheduling (scheduler/priority.py, admission.order_waiting) on a fake runner: lower
values are admitted first; a waiting request with no running place or too few KV slots
retracts running requests of a strictly higher value (the highest first), which resume later
with their output kept; equal values never preempt; decode's KV shortage retracts the highest
value first; without --enable-priority-scheduling nothing changes."""

from __future__ import annotations

import msgspec
import pytest
from helpers.fake_runner import FakeRunner, collect, expected, fake_scheduler, generate, run_to_idle

from radixflow.runtime.scheduler.req import ReqStatus


def gen(rid: str, prompt: list[int], priority: int | None, **sampling):
    sampling.setdefault("max_new_tokens", 6)
    sampling.setdefault("ignore_eos", True)
    return msgspec.structs.replace(generate(rid, prompt, **sampling), priority=priority)


def prompt_of(i: int, n: int = 4) -> list[int]:
    return [2 + (7 * i + k) % 60 for k in range(n)]


def admission_order(sched, *msgs) -> list[str]:
    order: list[str] = []
    got = {}
    inbox = list(msgs)
    for _ in range(500):
        collect(sched.step(inbox), got)
        inbox = []
        for req in sched.running + sched.prefilling:
            if req.rid not in order:
                order.append(req.rid)
        if sched.is_idle:
            break
    sched.check_slots()
    for msg in msgs:
        assert got[msg.rid].ids == expected(list(msg.input_ids), msg.sampling.max_new_tokens)
    return order


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_lower_values_are_admitted_first_then_the_policy(policy):
    sched = fake_scheduler(FakeRunner(max_running=1), enable_priority_scheduling=True,
                           schedule_policy=policy)
    msgs = [gen("p5", prompt_of(0), 5), gen("none", prompt_of(1), None),
            gen("p-1", prompt_of(2), -1), gen("p0", prompt_of(3), 0), gen("p5b", prompt_of(4), 5)]
    assert admission_order(sched, *msgs) == ["p-1", "none", "p0", "p5", "p5b"]
    assert sched.prefill.preemption.num_retractions == 0


def test_without_the_flag_priority_changes_nothing():
    sched = fake_scheduler(FakeRunner(max_running=1), schedule_policy="fcfs")
    msgs = [gen("a", prompt_of(0), 5), gen("b", prompt_of(1), 0), gen("c", prompt_of(2), -3)]
    assert admission_order(sched, *msgs) == ["a", "b", "c"]
    assert sched.prefill.preemption is None and sched.num_retractions == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_a_lower_value_retracts_the_highest_running_value_for_a_place(overlap):
    sched = fake_scheduler(FakeRunner(max_running=2), enable_priority_scheduling=True,
                           enable_overlap_schedule=overlap)
    got = collect(sched.step([gen("mid", prompt_of(0), 3, max_new_tokens=20),
                              gen("low", prompt_of(1), 8, max_new_tokens=20)]), {})
    collect(sched.step([]), got)
    assert {r.rid for r in sched.running} == {"mid", "low"}
    collect(sched.step([gen("urgent", prompt_of(2), 0, max_new_tokens=4)]), got)
    assert {r.rid for r in sched.running} == {"mid", "urgent"}
    low = sched.by_rid["low"]
    assert low.status == ReqStatus.WAITING and low.num_retractions == 1 and low.output_ids
    assert sched.prefill.preemption.num_retractions == 1
    run_to_idle(sched, got=got)
    for rid, i, n in (("mid", 0, 20), ("low", 1, 20), ("urgent", 2, 4)):
        assert got[rid].ids == expected(prompt_of(i), n), rid
    assert got["low"].outputs[-1].finish.type == "length"


def test_within_one_value_the_latest_arrival_goes_first():
    sched = fake_scheduler(FakeRunner(max_running=2), enable_priority_scheduling=True)
    sched.step([gen("first", prompt_of(0), 4, max_new_tokens=20),
                gen("second", prompt_of(1), 4, max_new_tokens=20)])
    sched.step([gen("urgent", prompt_of(2), 1)])
    assert [r.rid for r in sched.waiting] == ["second"]
    run_to_idle(sched)


@pytest.mark.parametrize("value", [4, 9])
def test_an_equal_or_higher_value_waits_its_turn(value):
    sched = fake_scheduler(FakeRunner(max_running=2), enable_priority_scheduling=True)
    sched.step([gen("a", prompt_of(0), 4, max_new_tokens=10),
                gen("b", prompt_of(1), 4, max_new_tokens=10)])
    sched.step([gen("c", prompt_of(2), value)])
    assert [r.rid for r in sched.waiting] == ["c"] and sched.num_retractions == 0
    run_to_idle(sched)
    assert sched.num_retractions == 0


def test_too_few_kv_slots_retracts_a_higher_value():
    runner = FakeRunner(num_slots=64, context_len=64)
    sched = fake_scheduler(runner, enable_priority_scheduling=True)
    got = collect(sched.step([gen("low", prompt_of(0, 30), 7, max_new_tokens=10)]), {})
    free = sched.state.kv_pool.num_free + sched.state.tree.evictable_size()
    big = [2 + (5 * k) % 60 for k in range(free + 4)]  # more than is left, less than the pool
    collect(sched.step([gen("urgent", big, 0, max_new_tokens=3)]), got)
    assert [r.rid for r in sched.waiting] == ["low"]
    assert sched.by_rid["urgent"].status in (ReqStatus.RUNNING, ReqStatus.PREFILLING)
    run_to_idle(sched, got=got)
    assert got["low"].ids == expected(prompt_of(0, 30), 10)
    assert got["urgent"].ids == expected(big, 3)


def test_no_retraction_when_the_victims_could_not_make_enough_room():
    runner = FakeRunner(num_slots=64, context_len=64)
    sched = fake_scheduler(runner, enable_priority_scheduling=True)
    sched.step([gen("peer", prompt_of(0, 30), 0, max_new_tokens=10),
                gen("low", prompt_of(1, 6), 7, max_new_tokens=10)])
    free = sched.state.kv_pool.num_free + sched.state.tree.evictable_size()
    big = [2 + (5 * k) % 60 for k in range(free + 12)]  # low's ~8 slots would not do
    sched.step([gen("urgent", big, 0, max_new_tokens=2)])
    assert sched.num_retractions == 0
    assert {r.rid for r in sched.running} == {"peer", "low"}
    run_to_idle(sched)


def test_decode_kv_shortage_retracts_the_highest_value_first():
    runner = FakeRunner(num_slots=64)
    sched = fake_scheduler(runner, disable_radix_cache=True, enable_priority_scheduling=True)
    got = collect(sched.step([gen("long", [2, 3, 4], 0, max_new_tokens=30),
                              gen("short", [20, 21], 9, max_new_tokens=5)]), {})
    held = sched.state.kv_pool.alloc(sched.state.kv_pool.num_free)  # the pool is full
    collect(sched.step([]), got)
    assert [r.rid for r in sched.running] == ["long"] and sched.waiting[0].rid == "short"
    sched.state.kv_pool.free(held)
    run_to_idle(sched, got=got)
    assert got["long"].ids == expected([2, 3, 4], 30) and got["short"].ids == expected([20, 21], 5)
