"""One request's failure fails that request (scheduler/failures.py), on a tiny random model with
faults patched in: a constraint compile that crashes, a forward pass out of memory (retried in
halves; a request that fails alone is aborted), a crash while a sampled token is committed, a
step that fails with nobody to blame; the others complete and no KV slot leaks. A broken
invariant raises InvariantBroken, and stops a real server's scheduler process with a message
and a non-zero exit."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers.live_server import LiveServer, kill_all, wait_gone

from radixflow.runtime.errors import InvariantBroken
from radixflow.runtime.messages import GenerateReq, TokenBatchOut
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server_args import server_args_from

PROMPTS = {"a": [40, 41, 42, 43], "b": [50, 51, 52, 53, 54, 55], "c": [60, 61, 62]}


class Driver:
    """Steps a Scheduler until idle and keeps each request's tokens and finish."""

    def __init__(self, sched):
        self.sched = sched
        self.out: dict[str, dict] = {}

    def run(self, *msgs) -> dict[str, dict]:
        self.out = {}
        msgs = list(msgs)
        for _ in range(2000):
            for msg in self.sched.step(msgs):
                if isinstance(msg, TokenBatchOut):
                    for o in msg.outputs:
                        got = self.out.setdefault(o.rid, {"ids": [], "finish": None})
                        got["ids"] += o.new_ids
                        got["finish"] = o.finish
            msgs = []
            if self.sched.is_idle:
                break
        assert self.sched.is_idle, "the scheduler did not finish its requests"
        self.sched.check_slots()
        return self.out


def req(rid, max_new_tokens=10, **sampling) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=PROMPTS[rid[0]], sampling=SamplingParams(
        max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True, **sampling))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "overlap"])
def sched(request, tiny_llama):
    from radixflow.runtime.scheduler.scheduler import Scheduler

    overlap = {"enable_overlap_schedule": True} if request.param else {
        "disable_overlap_schedule": True}
    s = Scheduler.from_args(server_args_from(str(tiny_llama), {
        "dtype": "float32", "max_total_tokens": 2000, **overlap}, who="test"))
    assert s.overlap == request.param
    yield s
    s.shutdown()


@pytest.fixture
def driver(sched):
    sched.state.kv.flush()
    return Driver(sched)


@pytest.fixture(scope="module")
def reference(sched):
    """Each prompt's greedy tokens on a scheduler with nothing patched."""
    sched.state.kv.flush()
    return {rid: got["ids"] for rid, got in Driver(sched).run(req("a"), req("b"), req("c")).items()}


def assert_failed_alone(out, bad: str, reference, match: str) -> None:
    finish = out[bad]["finish"]
    assert finish.type == "abort" and finish.status_code == 500, finish
    assert "internal error" in finish.message and match in finish.message, finish.message
    for rid, got in out.items():
        if rid != bad:
            assert got["finish"].type == "length", (rid, got["finish"])
            assert got["ids"] == reference[rid], rid


# ---- one request's own failure ------------------------------------------------------------------


def test_a_crashing_compile_fails_only_its_request(driver, reference, monkeypatch):
    cache = driver.sched.grammars.backend._cache
    compile_fn = cache._compile_fn

    def crash(key):
        if key == ("regex", "[0-9]{4}x"):
            raise RuntimeError("the compiler crashed")
        return compile_fn(key)

    monkeypatch.setattr(cache, "_compile_fn", crash)
    out = driver.run(req("a"), req("bad", regex="[0-9]{4}x"), req("b"))
    assert_failed_alone(out, "bad", reference, "the compiler crashed")
    assert out["bad"]["ids"] == []
    # the scheduler goes on, constraints included
    out = driver.run(req("c"), req("c2", 4, regex="[0-9]{4}"))
    assert out["c"]["ids"] == reference["c"] and len(out["c2"]["ids"]) == 4


def test_a_request_that_cannot_be_taken_in_fails_alone(driver, reference, monkeypatch):
    submit = driver.sched.grammars.submit

    def broken(r):
        if r.rid == "bad":
            raise ValueError("unexpected constraint state")
        return submit(r)

    monkeypatch.setattr(driver.sched.grammars, "submit", broken)
    out = driver.run(req("a"), req("bad", regex="[0-9]+"), req("c"))
    assert_failed_alone(out, "bad", reference, "unexpected constraint state")


def test_a_crash_while_committing_a_token_fails_only_that_request(driver, reference,
                                                                  monkeypatch):
    from radixflow.runtime.scheduler import commit

    check_stops = commit.check_stops

    def broken(r, token, context_len):
        if r.rid == "bad" and len(r.output_ids) == 3:
            raise KeyError("stop checker state")
        return check_stops(r, token, context_len)

    monkeypatch.setattr(commit, "check_stops", broken)
    out = driver.run(req("a"), req("bad"), req("b"), req("c"))
    assert_failed_alone(out, "bad", reference, "stop checker state")
    assert out["bad"]["ids"] == reference["b"][:3]  # (what it had when it failed)


# ---- forward passes -----------------------------------------------------------------------------


def test_a_memory_error_in_a_forward_is_retried_in_halves(driver, reference, monkeypatch):
    runner = driver.sched.runner
    forward = runner.forward
    raised = []

    def flaky(mode, parts, slots):
        if len({p.req_pool_idx for p in parts}) > 1 and len(raised) < 2:
            raised.append(mode)
            raise MemoryError("out of memory (test)")
        return forward(mode, parts, slots)

    monkeypatch.setattr(runner, "forward", flaky)
    failed = driver.sched.failures.num_failed_requests
    out = driver.run(req("a"), req("b"), req("c"))
    assert len(raised) == 2
    for rid, got in out.items():
        assert got["finish"].type == "length" and got["ids"] == reference[rid], rid
    assert driver.sched.failures.num_failed_requests == failed


def test_a_request_that_never_fits_fails_alone(driver, reference, monkeypatch):
    sched = driver.sched
    forward = sched.runner.forward

    def oom(mode, parts, slots):
        bad = sched.by_rid.get("bad")
        if bad is not None and bad.output_ids and bad.req_pool_idx in {
                p.req_pool_idx for p in parts}:
            raise MemoryError("CUDA out of memory (test)")
        return forward(mode, parts, slots)

    monkeypatch.setattr(sched.runner, "forward", oom)
    out = driver.run(req("a"), req("bad"), req("b"), req("c"))
    assert_failed_alone(out, "bad", reference, "out of memory")
    assert len(out["bad"]["ids"]) <= 2


def test_a_step_with_nobody_to_blame_fails_its_running_requests_and_goes_on(
        driver, reference, monkeypatch):
    sched = driver.sched
    pick = sched.commit.pick
    calls = []

    def broken(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("sampler bug")
        return pick(*args)

    monkeypatch.setattr(sched.commit, "pick", broken)
    out = driver.run(req("a"), req("b"))
    for got in out.values():
        assert got["finish"].status_code == 500 and "sampler bug" in got["finish"].message
    out = driver.run(req("c"))  # serving goes on
    assert out["c"]["ids"] == reference["c"]


# ---- invariants ---------------------------------------------------------------------------------


def test_a_leaked_slot_is_a_broken_invariant(driver):
    sched = driver.sched
    kv_pool, req_to_token_pool = sched.state.kv_pool, sched.state.req_to_token_pool
    slot = kv_pool.alloc(1)
    with pytest.raises(InvariantBroken, match="KV slot leak"):
        sched.check_slots()
    kv_pool.free(slot)
    sched.check_slots()
    with pytest.raises(InvariantBroken, match="freed twice"):
        kv_pool.free(kv_pool.free_slots()[:1].clone())
    row = req_to_token_pool.alloc()
    req_to_token_pool.free(row)
    with pytest.raises(InvariantBroken, match="not held"):
        req_to_token_pool.free(row)


def leaking_scheduler(*args, **kwargs):
    """A RADIXFLOW_SCHEDULER_ENTRY: the real scheduler process, whose scheduler loses a KV
    slot with every request (the idle check finds it)."""
    from radixflow.runtime.scheduler import process
    from radixflow.runtime.scheduler.scheduler import Scheduler

    step = Scheduler.step

    def leaky(self, inbox):
        if any(isinstance(m, GenerateReq) for m in inbox):
            self.state.kv_pool.alloc(1)
        return step(self, inbox)

    Scheduler.step = leaky
    process.run_scheduler(*args, **kwargs)


def test_a_broken_invariant_stops_the_scheduler_process(tiny_llama, tmp_path, monkeypatch):
    import requests

    here = Path(__file__).parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(here), str(here.parents[1]), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("RADIXFLOW_SCHEDULER_ENTRY", "test_scheduler_failures:leaking_scheduler")
    srv = LiveServer("--model", str(tiny_llama), "--max-total-tokens", "2048",
                     log_path=tmp_path / "serve.log")
    children = srv.children()
    try:
        r = requests.post(srv.url + "/generate", timeout=60, json={
            "text": "Hi", "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200
        assert srv.proc.wait(60) == 1
        log = srv.log()
        assert "the scheduler stops: an invariant is broken: KV slot leak" in log, log
        assert "exit code 3" in log or "an invariant is broken" in log
        assert not wait_gone(children), "child processes outlived the server"
    finally:
        kill_all(srv.children())
        srv.stop(signal.SIGKILL)
