"""Sessions (SGLang's open_session / close_session / session_params) on a tiny random model:
a request continues an earlier request's tokens without the client sending them again, with
the same output as re-sending them; branches, offset, drop_previous_output, replace, close,
capacity and timeout; the KV slot invariant after each."""

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
    TokenBatchOut,
)
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server_args import server_args_from

GREEDY = {"temperature": 0, "ignore_eos": True}
BOS = 1  # <|im_start|>, the tiny tokenizer's bos_token


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=3000,
                max_running_requests=8) as eng:
        yield eng


def ids(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


def prompt_ids(result: dict) -> list[int]:
    """The prompt the scheduler ran, read back from the prompt logprobs (logprob_start_len=0)."""
    return [entry[1] for entry in result["meta_info"]["input_token_logprobs"]]


def gen(engine, text_or_ids, max_new_tokens=8, **kw) -> dict:
    key = "input_ids" if isinstance(text_or_ids, list) else "prompt"
    return engine.generate(**{key: text_or_ids}, sampling_params={
        "max_new_tokens": max_new_tokens, **GREEDY}, **kw)


def read_prompt(engine, text_or_ids, session_params: dict) -> list[int]:
    """The whole prompt of a session request that generates nothing."""
    return prompt_ids(gen(engine, text_or_ids, 0, session_params=session_params,
                          return_logprob=True, logprob_start_len=0))


# ---- continuing without re-sending -----------------------------------------------------------


def test_continuation_equals_resending_the_history(engine):
    """Three turns sent as session continuations give exactly the tokens of sending the whole
    history each time; the history is found in the prefix cache, not sent."""
    sid = engine.open_session(capacity_of_str_len=400)
    turns = ["The quick brown fox", " jumps over the lazy dog.", " Once upon a time"]
    history: list[int] = []
    rid = None
    for i, text in enumerate(turns):
        own = ids(engine, text)
        res = gen(engine, text, 12, session_params={"id": sid, "rid": rid})
        meta = res["meta_info"]
        assert meta["prompt_tokens"] == len(history) + len(own)
        if history:  # all but the history's last token (its KV was never computed) is cached
            assert meta["cached_tokens"] >= len(history) - 1
        resent = gen(engine, history + own, 12)
        assert res["output_ids"] == resent["output_ids"], f"turn {i}"
        engine.flush_cache()
        uncached = gen(engine, history + own, 12)
        assert uncached["meta_info"]["cached_tokens"] == 0
        assert res["output_ids"] == uncached["output_ids"], f"turn {i}"
        history += own + res["output_ids"]
        rid = meta["id"]
    engine.close_session(sid)
    settle(engine)


def test_branch_from_an_earlier_request(engine):
    sid = engine.open_session(400)
    a = gen(engine, "Once upon a time", 6, session_params={"id": sid}, rid="a")
    gen(engine, " there was a robot", 6, session_params={"id": sid, "rid": "a"}, rid="b")
    # c continues a, not b: b's tokens are not in its prompt
    c = gen(engine, " in a library", 6, session_params={"id": sid, "rid": "a"}, rid="c")
    history = ids(engine, "Once upon a time") + a["output_ids"]
    assert c["meta_info"]["prompt_tokens"] == len(history) + len(ids(engine, " in a library"))
    assert c["output_ids"] == gen(engine, history + ids(engine, " in a library"), 6)["output_ids"]
    # and a request continues c (a branch of a branch)
    d = read_prompt(engine, " The end", {"id": sid, "rid": "c"})
    assert d == history + ids(engine, " in a library") + c["output_ids"] + ids(engine, " The end")
    engine.close_session(sid)
    settle(engine)


def test_streamed_continuation(engine):
    sid = engine.open_session(400)
    a = gen(engine, "The capital of France", 5, session_params={"id": sid})
    events = list(engine.generate(" is", {"max_new_tokens": 5, **GREEDY}, stream=True,
                                  session_params={"id": sid, "rid": a["meta_info"]["id"]}))
    full = ids(engine, "The capital of France") + a["output_ids"] + ids(engine, " is")
    assert events[-1]["output_ids"] == gen(engine, full, 5)["output_ids"]
    assert events[-1]["meta_info"]["prompt_tokens"] == len(full)
    engine.close_session(sid)
    settle(engine)


# ---- how the prompt is built (SGLang's session controller) -------------------------------------


def test_prompt_construction_offset_drop_output_and_bos(engine):
    sid = engine.open_session(400)
    p = ids(engine, "The quick brown fox")
    a = gen(engine, p, 5, session_params={"id": sid}, rid="root")
    out = a["output_ids"]
    own = ids(engine, " jumps")
    s = {"id": sid, "rid": "root"}
    assert read_prompt(engine, own, s) == p + out + own
    assert read_prompt(engine, own, {**s, "offset": 0}) == p + out + own  # 0: append
    assert read_prompt(engine, own, {**s, "offset": 3}) == p[:3] + own
    assert read_prompt(engine, own, {**s, "offset": -2}) == (p + out)[:-2] + own
    assert read_prompt(engine, own, {**s, "offset": 10**6}) == p + out + own
    assert read_prompt(engine, own, {**s, "drop_previous_output": True}) == p + own
    assert read_prompt(engine, own, {**s, "drop_previous_output": True, "offset": -1}) == (
        p[:-1] + own)
    # a leading BOS is dropped when appending (the history starts the text), kept in a root
    assert read_prompt(engine, [BOS, *own], s) == p + out + own
    assert read_prompt(engine, [BOS, *own], {"id": sid}) == [BOS, *own]
    # no rid: a new branch with no history (offset and drop_previous_output then mean nothing)
    assert read_prompt(engine, own, {"id": sid, "offset": 2}) == own
    # id null: SGLang serves the request outside any session
    outside = gen(engine, own, 2, session_params={"id": None})
    assert outside["meta_info"]["prompt_tokens"] == len(own)
    engine.close_session(sid)
    settle(engine)


def test_session_keeps_each_token_once(engine):
    """A node keeps what its request added (own tokens + output), not the whole history."""
    sid = engine.open_session(400)
    rid = None
    added = 0
    for text in ["Once upon a time", " there was", " a little robot"]:
        res = gen(engine, text, 4, session_params={"id": sid, "rid": rid})
        added += len(ids(engine, text)) + len(res["output_ids"])
        rid = res["meta_info"]["id"]
    session = engine.scheduler.sessions.sessions[sid]
    assert len(session.nodes) == 3 and session.num_tokens() == added
    engine.close_session(sid)
    gen(engine, "x", 1)  # one more step: the close was handled
    assert sid not in engine.scheduler.sessions.sessions
    settle(engine)


# ---- refusals -------------------------------------------------------------------------------


def test_close_then_use_is_refused(engine):
    sid = engine.open_session(400)
    a = gen(engine, "Hello", 3, session_params={"id": sid})
    engine.close_session(sid)
    for params in ({"id": sid}, {"id": sid, "rid": a["meta_info"]["id"]}):
        with pytest.raises(InvalidRequest, match="session_params.id: no open session"):
            gen(engine, " again", 3, session_params=params)
    engine.close_session(sid)  # closing twice (or an unknown id) is harmless, as in SGLang
    engine.close_session("never-opened")
    with pytest.raises(InvalidRequest, match="no open session 'never-opened'"):
        gen(engine, "x", 1, session_params={"id": "never-opened"})
    settle(engine)


def test_unknown_rid_and_duplicate_rid_are_refused(engine):
    sid = engine.open_session(400)
    gen(engine, "Hello", 3, session_params={"id": sid}, rid="first")
    with pytest.raises(InvalidRequest, match="session_params.rid: 'nope' is not a request"):
        gen(engine, " again", 3, session_params={"id": sid, "rid": "nope"})
    with pytest.raises(InvalidRequest, match="'first' is already a request of session"):
        gen(engine, " again", 3, session_params={"id": sid, "rid": "first"}, rid="first")
    # a request outside the session may reuse the rid, and the session is unchanged
    gen(engine, "Hello", 1, rid="first")
    assert list(engine.scheduler.sessions.sessions[sid].nodes) == ["first"]
    engine.close_session(sid)
    settle(engine)


def test_capacity_bounds_every_request_of_the_session(engine):
    first = ids(engine, "The quick brown fox")
    sid = engine.open_session(capacity_of_str_len=len(first) + 8 + 6)
    a = gen(engine, first, 8, session_params={"id": sid}, rid="a")
    history = len(first) + len(a["output_ids"])
    long_turn = ids(engine, " jumps over the lazy dog, then sleeps.")
    assert history + len(long_turn) > len(first) + 14
    with pytest.raises(InvalidRequest, match=r"capacity_of_str_len"):
        gen(engine, long_turn, 4, session_params={"id": sid, "rid": "a"})
    # a prompt that fits gets what is left of the capacity, at most
    short = ids(engine, " jumps")
    b = gen(engine, short, 50, session_params={"id": sid, "rid": "a"})
    room = len(first) + 14 - history - len(short)
    assert b["meta_info"]["completion_tokens"] == room
    assert b["meta_info"]["finish_reason"] == {"type": "length", "length": room}
    # the first request of a session is bounded too
    with pytest.raises(InvalidRequest, match="capacity_of_str_len"):
        gen(engine, long_turn * 3, 1, session_params={"id": sid})
    engine.close_session(sid)
    settle(engine)


def test_refused_request_leaves_the_session_unchanged(engine):
    """history + own tokens past the model's context: refused (400), nothing recorded, no
    slot leaked."""
    sid = engine.open_session(10_000)
    a = gen(engine, "Once upon a time", 4, session_params={"id": sid}, rid="a")
    too_long = [5] * (512 - len(a["output_ids"]))
    with pytest.raises(InvalidRequest, match="context"):
        gen(engine, too_long, 1, session_params={"id": sid, "rid": "a"}, rid="too-long")
    with pytest.raises(InvalidRequest, match="'too-long' is not a request"):
        gen(engine, "x", 1, session_params={"id": sid, "rid": "too-long"})
    # max_new_tokens is cut to what the context leaves after the history
    near = [5] * (500 - len(ids(engine, "Once upon a time")) - len(a["output_ids"]))
    b = gen(engine, near, 50, session_params={"id": sid, "rid": "a"})
    assert b["meta_info"]["prompt_tokens"] + b["meta_info"]["completion_tokens"] == 512
    assert list(engine.scheduler.sessions.sessions[sid].nodes) == ["a", b["meta_info"]["id"]]
    engine.close_session(sid)
    settle(engine)


def test_timeout_closes_an_idle_session(engine):
    sid = engine.open_session(400, timeout=1.0)
    gen(engine, "Hello", 2, session_params={"id": sid}, rid="t1")
    gen(engine, " there", 2, session_params={"id": sid, "rid": "t1"})  # in time: still open
    time.sleep(1.5)
    with pytest.raises(InvalidRequest, match="no open session"):
        gen(engine, " again", 2, session_params={"id": sid, "rid": "t1"})
    settle(engine)


def test_open_session_arguments(engine):
    assert engine.open_session(100, session_id="named") == "named"
    with pytest.raises(InvalidRequest, match="already open") as err:
        engine.open_session(100, session_id="named")
    assert err.value.param == "session_id"
    engine.close_session("named")
    gen(engine, "x", 1)
    assert engine.open_session(100, session_id="named") == "named"  # reopened once closed
    engine.close_session("named")
    for kwargs, param in [({"capacity_of_str_len": 0}, "capacity_of_str_len"),
                          ({"capacity_of_str_len": "9"}, "capacity_of_str_len"),
                          ({"capacity_of_str_len": 9, "session_id": ""}, "session_id"),
                          ({"capacity_of_str_len": 9, "timeout": 0}, "timeout"),
                          ({"capacity_of_str_len": 9, "streaming": True}, "streaming")]:
        with pytest.raises(InvalidRequest) as err:
            engine.open_session(**kwargs)
        assert err.value.param == param
    settle(engine)


@pytest.mark.parametrize("session_params, param", [
    ("abc", "session_params"),
    ({"id": "s", "bogus": 1}, "session_params.bogus"),
    ({"id": 5}, "session_params.id"),
    ({"id": "s", "rid": 7}, "session_params.rid"),
    ({"id": "s", "offset": True}, "session_params.offset"),
    ({"id": "s", "offset": 1.5}, "session_params.offset"),
    ({"id": "s", "replace": "yes"}, "session_params.replace"),
    ({"id": "s", "drop_previous_output": 1}, "session_params.drop_previous_output"),
])
def test_bad_session_params_name_the_field(engine, session_params, param):
    with pytest.raises(InvalidRequest) as err:
        gen(engine, "hello", 1, session_params=session_params)
    assert err.value.param == param


def test_session_takes_one_prompt(engine):
    sid = engine.open_session(400)
    for prompt, params in [(["a", "b"], {"max_new_tokens": 1}),
                           ("a", {"max_new_tokens": 1, "n": 2, "temperature": 1.0})]:
        with pytest.raises(InvalidRequest) as err:
            engine.generate(prompt, params, session_params={"id": sid})
        assert err.value.param == "session_params"
    engine.close_session(sid)
    settle(engine)


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

    sched = Scheduler.from_args(server_args_from(
        str(tiny_llama), {"dtype": "float32", "max_total_tokens": 3000}, who="test"))
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
