"""Session limits: --max-open-sessions (opening past it is refused, status 429),
--max-session-timeout (`timeout: null` means it, a longer timeout is clipped to it),
--max-session-requests (a request past it is refused); sessions closed by their timeout are
reported (SessionsClosed) so the HTTP process forgets them too."""

from __future__ import annotations

import time

import pytest
from helpers.engine_checks import settle

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.messages import (
    CloseSessionReq,
    GenerateReq,
    OpenSessionDone,
    OpenSessionReq,
    SessionParams,
    SessionsClosed,
    TokenBatchOut,
)
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduler.sessions import TOO_MANY_SESSIONS, Sessions
from radixflow.runtime.server_args import server_args_from


def test_timeout_null_is_the_longest_and_longer_ones_are_clipped():
    s = Sessions(None, max_timeout=5.0)
    assert s.open("a", 100, None, now=0.0) is None
    assert s.open("b", 100, 60.0, now=0.0) is None
    assert s.open("c", 100, 2.0, now=0.0) is None
    assert [s.sessions[k].timeout for k in "abc"] == [5.0, 5.0, 2.0]
    s.reap(now=3.0)
    assert set(s.sessions) == {"a", "b"} and s.take_expired() == ["c"]
    s.reap(now=6.0)
    assert not s.sessions and sorted(s.take_expired()) == ["a", "b"]
    assert s.take_expired() == []


def test_opening_past_the_cap_is_refused_until_one_closes():
    s = Sessions(None, max_open=2, max_timeout=10.0)
    assert s.open("a", 100, None, now=0.0) is None
    assert s.open("b", 100, 1.0, now=0.0) is None
    message, status = s.open("c", 100, None, now=0.5)
    assert status == TOO_MANY_SESSIONS == 429 and "too many open sessions" in message
    assert s.open("a", 100, None, now=0.5)[1] == 400  # the id is taken: not a 429
    assert s.open("c", 100, None, now=2.0) is None  # b timed out: room again
    assert s.take_expired() == ["b"]
    s.close("a")
    assert s.open("d", 100, None, now=2.0) is None


class Driver:
    def __init__(self, sched):
        self.sched = sched
        self.finish: dict = {}
        self.replies: list = []

    def run(self, *msgs) -> None:
        msgs = list(msgs)
        while True:
            for msg in self.sched.step(msgs):
                if isinstance(msg, TokenBatchOut):
                    for o in msg.outputs:
                        if o.finish is not None:
                            self.finish[o.rid] = o.finish
                else:
                    self.replies.append(msg)
            msgs = []
            if self.sched.is_idle:
                break
        self.sched.check_slots()


def req(rid, session: SessionParams) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=[40, 41], session=session, sampling=SamplingParams(
        max_new_tokens=2, temperature=0, ignore_eos=True))


@pytest.fixture(scope="module")
def sched(tiny_llama):
    from radixflow.runtime.scheduler.scheduler import Scheduler

    s = Scheduler.from_args(server_args_from(str(tiny_llama), {
        "dtype": "float32", "max_total_tokens": 2000, "max_open_sessions": 2,
        "max_session_requests": 3, "max_session_timeout": 2.0}, who="test"))
    yield s
    s.shutdown()


def test_scheduler_answers_429_past_max_open_sessions(sched):
    d = Driver(sched)
    d.run(OpenSessionReq(session_id="x", capacity_of_str_len=100),
          OpenSessionReq(session_id="y", capacity_of_str_len=100),
          OpenSessionReq(session_id="z", capacity_of_str_len=100))
    assert [(r.session_id, r.success, r.status_code) for r in d.replies] == [
        ("x", True, None), ("y", True, None), ("z", False, 429)]
    assert "--max-open-sessions" in d.replies[2].message
    d.run(CloseSessionReq(session_id="x"), CloseSessionReq(session_id="y"))


def test_a_session_holds_at_most_max_session_requests(sched):
    d = Driver(sched)
    d.run(OpenSessionReq(session_id="s", capacity_of_str_len=100, timeout=30.0))
    d.run(req("r1", SessionParams(id="s")))
    d.run(req("r2", SessionParams(id="s", rid="r1")))
    d.run(req("r3", SessionParams(id="s", rid="r2")))
    assert all(d.finish[r].type == "length" for r in ("r1", "r2", "r3"))
    d.run(req("r4", SessionParams(id="s", rid="r3")))
    refused = d.finish["r4"]
    assert refused.type == "abort" and refused.status_code == 400
    assert "--max-session-requests" in refused.message
    d.run(req("r5", SessionParams(id="s", replace=True)))  # starting over is allowed
    assert d.finish["r5"].type == "length"
    d.run(CloseSessionReq(session_id="s"))


def test_timed_out_sessions_are_reported(sched):
    d = Driver(sched)
    d.run(OpenSessionReq(session_id="t", capacity_of_str_len=100))  # timeout null: 2 s
    assert d.replies == [OpenSessionDone(session_id="t", success=True)]
    deadline = time.monotonic() + 10
    while not any(isinstance(r, SessionsClosed) for r in d.replies):
        assert time.monotonic() < deadline, "the session was never reaped"
        time.sleep(0.1)
        d.run()
    closed = [r for r in d.replies if isinstance(r, SessionsClosed)]
    assert closed == [SessionsClosed(session_ids=["t"])]
    d.run(req("late", SessionParams(id="t")))
    assert "no open session" in d.finish["late"].message


def test_engine_refuses_a_session_past_the_cap(tiny_llama):
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=2000,
                max_open_sessions=1) as engine:
        sid = engine.open_session(100)
        with pytest.raises(InvalidRequest, match="too many open sessions"):
            engine.open_session(100)
        engine.close_session(sid)
        engine.generate(input_ids=[40, 41], sampling_params={"max_new_tokens": 1})
        engine.close_session(engine.open_session(100))
        settle(engine)
