"""Sessions (SGLang's session_params) in the scheduler on a tiny random model: a request
continues an earlier request's tokens without the client sending them again; running requests
and replace, close and abort, stepped by hand; the KV slot invariant after each."""

from __future__ import annotations

import pytest

from radixflow.runtime.messages import (
    CloseSessionReq,
    GenerateReq,
    OpenSessionDone,
    OpenSessionReq,
    SessionParams,
    TokenBatchOut,
)
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server_args import server_args_from

# ---- running requests: a bare Scheduler, stepped by hand (deterministic) ------------------------


class Driver:
    """Steps a Scheduler and keeps each request's outputs."""

    def __init__(self, sched):
        self.sched = sched
        self.out: dict[str, dict] = {}
        self.replies: list = []

    def step(self, *msgs) -> None:
        for msg in self.sched.step(list(msgs)):
            if isinstance(msg, TokenBatchOut):
                for o in msg.outputs:
                    got = self.out.setdefault(o.rid, {"ids": [], "finish": None})
                    got["ids"] += o.new_ids
                    got.update(finish=o.finish, prompt_tokens=o.prompt_tokens,
                               cached_tokens=o.cached_tokens)
            else:
                self.replies.append(msg)

    def run(self, *msgs) -> None:
        self.step(*msgs)
        while not self.sched.is_idle:
            self.step()
        self.sched.check_slots()


def req(rid, input_ids, max_new_tokens, session=None) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=input_ids, sampling=SamplingParams(
        max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True), session=session)


@pytest.fixture
def driver(tiny_llama):
    from radixflow.runtime.scheduler.scheduler import Scheduler

    sched = Scheduler(server_args_from(str(tiny_llama), {"dtype": "float32",
                                                          "max_total_tokens": 3000}, who="test"))
    d = Driver(sched)
    d.step(OpenSessionReq(session_id="s", capacity_of_str_len=400))
    assert d.replies == [OpenSessionDone(session_id="s", success=True)]
    return d


PROMPT = [40, 41, 42, 43, 44, 45]


def test_appending_to_a_running_request_is_refused_replace_aborts_it(driver):
    driver.step(req("p", PROMPT, 100, SessionParams(id="s")))
    driver.step()
    assert driver.out["p"]["finish"] is None and driver.out["p"]["ids"]
    driver.step(req("c1", [50, 51], 4, SessionParams(id="s", rid="p")))
    finish = driver.out["c1"]["finish"]
    assert finish.status_code == 400 and "has not finished" in finish.message
    assert driver.out["p"]["finish"] is None  # untouched
    driver.step(req("c2", [50, 51], 4, SessionParams(id="s", rid="p", replace=True)))
    p = driver.out["p"]
    assert p["finish"].type == "abort" and "replaced by request 'c2'" in p["finish"].message
    driver.run()
    assert driver.out["c2"]["prompt_tokens"] == len(PROMPT) + len(p["ids"]) + 2
    assert driver.out["c2"]["cached_tokens"] >= len(PROMPT) + len(p["ids"]) - 1
    # the same tokens as sending p's partial history in full
    driver.run(req("check", PROMPT + p["ids"] + [50, 51], 4))
    assert driver.out["c2"]["ids"] == driver.out["check"]["ids"]


def test_replace_drops_the_requests_that_continued(driver):
    driver.run(req("a", PROMPT, 3, SessionParams(id="s")))
    driver.run(req("b", [50], 3, SessionParams(id="s", rid="a")))
    driver.step(req("c", [51], 100, SessionParams(id="s", rid="b")))  # still running
    driver.step(req("a2", [52], 3, SessionParams(id="s", rid="a", replace=True)))
    assert driver.out["c"]["finish"].type == "abort"  # c continued b, which a2 replaced
    driver.run()
    nodes = driver.sched.sessions.sessions["s"].nodes
    assert list(nodes) == ["a", "a2"]
    # replace without rid: the whole session is cleared
    driver.step(req("r", [53], 100, SessionParams(id="s", rid="a2")))
    driver.step(req("fresh", [54, 55], 2, SessionParams(id="s", replace=True)))
    assert driver.out["r"]["finish"].type == "abort"
    driver.run()
    assert list(nodes) == ["fresh"] and driver.out["fresh"]["prompt_tokens"] == 2


def test_close_with_a_running_request(driver):
    driver.step(req("p", PROMPT, 20, SessionParams(id="s")))
    driver.step(CloseSessionReq(session_id="s"))
    assert driver.out["p"]["finish"] is None
    driver.run()  # it finishes normally (as in SGLang) and nothing leaks
    assert driver.out["p"]["finish"].type == "length" and len(driver.out["p"]["ids"]) == 20
    assert len(driver.sched.sessions) == 0
    driver.run(req("late", [50], 2, SessionParams(id="s", rid="p")))
    assert "no open session" in driver.out["late"]["finish"].message


def test_aborted_request_can_be_continued_from_what_it_generated(driver):
    from radixflow.runtime.messages import AbortReq

    driver.step(req("p", PROMPT, 100, SessionParams(id="s")))
    driver.step()
    driver.run(AbortReq(rid="p"))
    partial = driver.out["p"]["ids"]
    assert driver.out["p"]["finish"].type == "abort" and partial
    driver.run(req("next", [50], 2, SessionParams(id="s", rid="p")))
    assert driver.out["next"]["prompt_tokens"] == len(PROMPT) + len(partial) + 1
