"""Decode (scheduler/decode.py) on a fake runner: one query row per uncomputed token, retraction
when the KV pool is short (the request with the most tokens left goes back to waiting and
recomputes), the overlapped path giving the same tokens, and the forward thread working on the
model's CUDA device."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers.fake_runner import (
    FakeRunner,
    collect,
    expected,
    fake_scheduler,
    generate,
    run_to_idle,
)

from radixflow.runtime.forward_batch import ForwardMode
from radixflow.runtime.scheduler import decode, device, scheduler
from radixflow.runtime.scheduler.req import ReqStatus


def decodes(runner: FakeRunner):
    return [c for c in runner.calls if c.mode == ForwardMode.DECODE]


def test_each_uncomputed_token_is_a_row_and_only_the_last_wants_logits():
    runner = FakeRunner()
    sched = fake_scheduler(runner)
    sched.step([generate("a", [2, 3, 4], max_new_tokens=6), generate("b", [9], max_new_tokens=6)])
    a = sched.by_rid["a"]
    assert a.output_ids == [5, 6] and a.computed_len == 4  # 6 is drawn, not yet computed
    a.output_ids += [40, 41]  # as jump-forward appends them: no sampling, computed next pass
    runner.reset_calls()
    sched.step([])
    (call,) = decodes(runner)
    rows_of_a = [p for p in call.parts if p.req_pool_idx == a.req_pool_idx]
    assert [(p.ids, p.logit_offsets) for p in rows_of_a] == [([6], []), ([40], []), ([41], [0])]
    assert [p.start_pos for p in rows_of_a] == [4, 5, 6]
    assert call.num_slots == 4  # a's three rows and b's one
    assert a.output_ids[-1] == 42 and a.computed_len == a.seq_len - 1
    run_to_idle(sched)


def test_a_short_kv_pool_retracts_the_request_with_the_most_tokens_left():
    runner = FakeRunner(num_slots=64)
    sched = fake_scheduler(runner, disable_radix_cache=True)
    got = collect(sched.step([generate("long", [2, 3, 4], max_new_tokens=30),
                              generate("short", [20, 21], max_new_tokens=5)]), {})
    assert {r.rid for r in sched.running} == {"long", "short"}
    held = sched.state.kv_pool.alloc(sched.state.kv_pool.num_free)  # the pool is full
    collect(sched.step([]), got)
    assert sched.num_retractions == 1
    assert [r.rid for r in sched.running] == ["short"] and sched.waiting[0].rid == "long"
    assert sched.waiting[0].status == ReqStatus.WAITING and sched.waiting[0].req_pool_idx is None
    sched.state.kv_pool.free(held)
    run_to_idle(sched, got=got)
    assert got["long"].ids == expected([2, 3, 4], 30) and got["short"].ids == expected([20, 21], 5)
    assert got["long"].finish.type == "length" and sched.by_rid == {}


def test_requests_retracted_by_a_tight_pool_still_get_all_their_tokens():
    runner = FakeRunner(num_slots=40)
    sched = fake_scheduler(runner)
    prompts = {f"r{i}": [2 + 10 * i + k for k in range(8)] for i in range(3)}
    got = run_to_idle(sched, *(generate(rid, p, max_new_tokens=12, ignore_eos=True)
                               for rid, p in prompts.items()))
    assert sched.num_retractions > 0
    for rid, prompt in prompts.items():
        assert got[rid].ids == expected(prompt, 12), rid


def test_alloc_refuses_when_not_even_one_request_fits():
    runner = FakeRunner(num_slots=16)
    sched = fake_scheduler(runner, disable_radix_cache=True)
    sched.step([generate("a", [2, 3, 4], max_new_tokens=8)])
    held = sched.state.kv_pool.alloc(sched.state.kv_pool.num_free)
    (a,) = sched.running
    a.output_ids.append(9)
    with pytest.raises(RuntimeError, match="even one request"):
        sched.decode.alloc([a])
    a.output_ids.pop()
    sched.state.kv_pool.free(held)
    run_to_idle(sched)


@pytest.mark.parametrize("prompt_len", [1, 5])
def test_overlapped_decoding_gives_the_same_tokens(prompt_len):
    prompts = {f"r{i}": [2 + 7 * i + k for k in range(prompt_len)] for i in range(4)}
    results = {}
    for overlap in (False, True):
        sched = fake_scheduler(FakeRunner(), enable_overlap_schedule=overlap,
                               disable_overlap_schedule=not overlap)
        assert sched.overlap == overlap
        got = run_to_idle(sched, *(generate(rid, p, max_new_tokens=3 + i, stop_token_ids=[30])
                                   for i, (rid, p) in enumerate(prompts.items())))
        sched.shutdown()
        results[overlap] = {rid: (g.ids, g.finish) for rid, g in got.items()}
    assert results[True] == results[False]


# ---- the device of the threads that run the model (data parallel on several GPUs) ----


def test_the_forward_thread_makes_the_replicas_device_its_own(monkeypatch):
    seen = []
    monkeypatch.setattr(decode, "use_device",
                        lambda d: seen.append((d, threading.current_thread().name)))
    thread = decode.ForwardThread(torch.device("cuda", 1))
    assert thread.submit(lambda: 7).result() == 7
    thread.shutdown()
    assert seen == [(torch.device("cuda", 1), seen[0][1])]
    assert seen[0][1].startswith("radixflow-forward")


def test_a_bare_cuda_device_is_pinned_to_the_current_one_at_start_up(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert device.concrete_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert device.concrete_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert device.concrete_device(torch.device("cpu")) == torch.device("cpu")


def test_use_device_sets_only_a_cuda_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    device.use_device(torch.device("cpu"))
    device.use_device(torch.device("cuda", 2))
    assert calls == [torch.device("cuda", 2)]


def test_the_scheduler_gives_its_device_to_the_threads_that_run_it(monkeypatch):
    seen = []
    monkeypatch.setattr(decode, "use_device", seen.append)
    monkeypatch.setattr(scheduler, "use_device", seen.append)
    sched = fake_scheduler(FakeRunner(device=torch.device("cpu")), enable_overlap_schedule=True,
                           disable_overlap_schedule=False)
    sched.use_device_here()  # what Engine's thread and the scheduler process do first
    got = run_to_idle(sched, generate("a", [2, 3], max_new_tokens=3))
    sched.shutdown()
    assert got["a"].ids == expected([2, 3], 3)
    assert seen == [sched.state.device, sched.state.device]
