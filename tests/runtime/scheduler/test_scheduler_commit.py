"""Commit (scheduler/commit.py, stops.py) on a fake runner: how a drawn token ends a request
(max_new_tokens, EOS and ignore_eos, stop ids, stop strings, the context), logprobs, aborts, and
a finish giving back every KV slot and request row."""

from __future__ import annotations

from helpers.fake_runner import (
    EOS,
    CharTokenizer,
    FakeRunner,
    collect,
    count_up,
    expected,
    fake_scheduler,
    generate,
    run_to_idle,
)

from radixflow.runtime.messages import AbortReq, GenerateReq
from radixflow.runtime.sampling_params import SamplingParams


def eos_after(n: int):
    """A model that says EOS once it has written n tokens after a prompt of one."""
    return lambda seq: EOS if len(seq) == n + 1 else count_up(seq)


def assert_all_given_back(sched) -> None:
    state = sched.state
    assert state.req_to_token_pool.num_free == state.req_to_token_pool.size
    assert state.kv_pool.num_free + state.tree.total_size() == state.kv_pool.num_slots
    assert state.tree.evictable_size() == state.tree.total_size()  # nothing stays locked
    assert not (sched.waiting or sched.prefilling or sched.running or sched.by_rid)


def test_max_new_tokens_ends_with_length_and_gives_everything_back():
    sched = fake_scheduler()
    got = run_to_idle(sched, generate("a", [2, 3], max_new_tokens=5),
                      generate("b", [40], max_new_tokens=1))
    assert got["a"].ids == expected([2, 3], 5) and got["b"].ids == [41]
    assert (got["a"].finish.type, got["a"].finish.length) == ("length", 5)
    assert got["a"].outputs[-1].completion_tokens == 5
    assert sched.stats_message().generation_tokens == 6
    assert_all_given_back(sched)


def test_eos_stops_unless_ignored():
    sched = fake_scheduler(FakeRunner(next_token=eos_after(3)))
    got = run_to_idle(sched, generate("stops", [2], max_new_tokens=10),
                      generate("ignores", [2], max_new_tokens=6, ignore_eos=True))
    assert got["stops"].ids == [3, 4, 5, EOS]
    assert (got["stops"].finish.type, got["stops"].finish.matched) == ("stop", EOS)
    assert len(got["ignores"].ids) == 6 and got["ignores"].ids[3] == EOS
    assert got["ignores"].finish.type == "length"
    assert_all_given_back(sched)


def test_a_stop_token_id_ends_the_output_on_it():
    sched = fake_scheduler()
    got = run_to_idle(sched, generate("a", [2], max_new_tokens=10, stop_token_ids=[6]))
    assert got["a"].ids == [3, 4, 5, 6]
    assert (got["a"].finish.type, got["a"].finish.matched) == ("stop", 6)


def test_a_stop_string_is_found_across_tokens():
    tokenizer = CharTokenizer()
    sched = fake_scheduler()
    prompt = tokenizer.encode("a")
    got = run_to_idle(sched, generate("a", prompt, max_new_tokens=10, stop=["ef"]))
    assert tokenizer.decode(got["a"].ids) == "bcdef"
    assert (got["a"].finish.type, got["a"].finish.matched) == ("stop", "ef")
    assert_all_given_back(sched)


def test_the_context_ends_an_output_that_reaches_it():
    sched = fake_scheduler(FakeRunner(context_len=8))
    got = run_to_idle(sched, generate("a", [2, 3, 4, 5, 6], max_new_tokens=100))
    assert got["a"].ids == [7, 8, 9]
    assert (got["a"].finish.type, got["a"].finish.length) == ("length", 3)


def test_logprobs_come_with_every_token():
    sched = fake_scheduler()
    got = run_to_idle(sched, GenerateReq(rid="a", input_ids=[2, 3], return_logprob=True,
                                         top_logprobs_num=2,
                                         sampling=SamplingParams(max_new_tokens=4, temperature=0)))
    logprobs = [lp for o in got["a"].outputs for lp in o.output_logprobs]
    tops = [t for o in got["a"].outputs for t in o.output_top_logprobs]
    assert len(logprobs) == 4 and all(-0.01 < lp <= 0 for lp in logprobs)  # the rigged winner
    assert [t[0][1] for t in tops] == got["a"].ids and all(len(t) == 2 for t in tops)


def test_an_abort_finishes_a_running_request_and_gives_its_slots_back():
    sched = fake_scheduler()
    got = collect(sched.step([generate("a", [2, 3], max_new_tokens=50),
                              generate("b", [20], max_new_tokens=3)]), {})
    collect(sched.step([AbortReq(rid="a")]), got)
    run_to_idle(sched, got=got)
    assert got["a"].finish.type == "abort" and got["a"].finish.message == "aborted by the client"
    assert len(got["a"].ids) < 50 and got["b"].ids == [21, 22, 23]
    assert_all_given_back(sched)


def test_a_finished_requests_tokens_stay_cached_for_the_next():
    sched = fake_scheduler()
    run_to_idle(sched, generate("a", [2, 3, 4, 5], max_new_tokens=3))
    assert sched.state.tree.total_size() == 6  # the prompt and the computed outputs
    got = run_to_idle(sched, generate("b", [2, 3, 4, 5, 6, 7, 8], max_new_tokens=1))
    assert got["b"].outputs[-1].cached_tokens == 6 and got["b"].ids == [9]
