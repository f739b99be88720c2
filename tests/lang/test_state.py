"""The lazy interpreter (ProgramState, run, run_batch, fork/join, streaming) over the stand-in."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers.fake_backend import FakeBackend

import radixflow as rf


@rf.function
def two_gens(s, topic):
    s += "Topic: " + topic + "\nA:" + rf.gen("a", max_tokens=8, stop="\n")
    s += "\nB:" + rf.gen("b", max_tokens=8)


def test_k_gens_without_python_between_cost_one_program_request():
    fake = FakeBackend()
    state = two_gens.run(topic="cats", backend=fake)
    assert len(fake.programs) == 1 and len(fake.calls) == 2
    assert state["a"] == " answer" and state.text() == "Topic: cats\nA: answer\nB: answer"
    assert state.num_stretches == 1


def test_python_reading_a_variable_splits_the_stretch():
    fake = FakeBackend(respond=lambda p, sp: "2+3" if p.endswith("Expr:") else " ok")

    @rf.function
    def tool(s):
        s += "Expr:" + rf.gen("expr", max_tokens=5)
        value = eval(s["expr"])  # the tool: Python between calls
        s += f" = {value}\nSo:" + rf.gen("final", max_tokens=4)

    state = tool.run(backend=fake)
    assert len(fake.programs) == 2
    assert fake.programs[1]["text"] == "Expr:2+3"
    assert state.text() == "Expr:2+3 = 5\nSo: ok"


def test_run_defaults_apply_to_every_gen_and_gen_options_win():
    fake = FakeBackend()
    two_gens.run(topic="x", backend=fake, temperature=0, max_tokens=3)
    a, b = (c["sampling_params"] for c in fake.calls)
    assert a["temperature"] == 0 and a["max_new_tokens"] == 8 and b["max_new_tokens"] == 8
    with pytest.raises(rf.InvalidRequest, match="unexpected argument 'tpo'"):
        two_gens.run(tpo="x", backend=fake)
    with pytest.raises(rf.InvalidRequest, match="missing a required argument"):
        two_gens.run(backend=fake)


def test_reading_a_variable_before_it_is_generated_is_a_clear_error():
    @rf.function
    def early(s):
        s += "x" + rf.gen("a", max_tokens=2)
        s += s["b"]

    with pytest.raises(rf.VariableNotFound, match=r"variable 'b' is not defined.*'a'"):
        early.run(backend=FakeBackend())


def test_roles_render_with_the_template_and_assistant_gens_stop_at_end_of_turn():
    fake = FakeBackend(respond=lambda p, sp: "Hello<|im_end|>junk")

    @rf.function
    def chat(s):
        s += rf.system("Be kind.")
        with s.user():
            s += "Hi"
        s += rf.assistant(rf.gen("reply", max_tokens=30))
        s += rf.user("Bye") + "after:" + rf.gen("outside", max_tokens=3)

    state = chat.run(backend=fake)
    stops = [c["sampling_params"]["stop"] for c in fake.calls]
    assert stops == [["<|im_end|>"], []]
    assert state["reply"] == "Hello"
    assert state.text().startswith("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi")
    assert state.messages() == [{"role": "system", "content": "Be kind."},
                                {"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Hello"},
                                {"role": "user", "content": "Bye"}]


def test_roles_must_nest_properly():
    @rf.function
    def bad(s):
        s += rf.user_begin()
        s += rf.assistant("x")

    with pytest.raises(rf.InvalidRequest, match="inside the open 'user' turn"):
        bad.run(backend=FakeBackend())


def test_select_keeps_scores_in_meta():
    fake = FakeBackend(logprob=lambda prefix, c: -0.1 if c in "blue" else -2.0)

    @rf.function
    def color(s):
        s += "Sky: " + rf.select("c", choices=["red", "blue", "green"])

    state = color.run(backend=fake)
    assert state["c"] == "blue"
    scores = state.scores("c")
    assert max(scores, key=scores.get) == "blue"
    assert state.get_meta_info("c")["method"] == "token_length_normalized"


@rf.function
def tree(s, mode):
    s += "Root."
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f" B{i}:" + rf.gen("idea", max_tokens=5)
    forks.join(mode)
    s += " Final:" + rf.gen("final", max_tokens=5)


def test_fork_and_lazy_join_travel_in_one_request():
    fake = FakeBackend(respond=lambda p, sp: p[-3:])
    gathered = tree.run(mode="gather", backend=fake)
    assert len(fake.programs) == 1 and len(fake.calls) == 4
    assert gathered["idea"] == ["B0:", "B1:", "B2:"]
    assert gathered.text() == "Root. Final:al:"
    concat = tree.run(mode="concat", backend=fake)
    assert concat.text() == "Root. B0:B0: B1:B1: B2:B2: Final:al:"


def test_branches_read_after_the_fork_ran_continue_independently_and_concurrently():
    started = threading.Barrier(3, timeout=10)

    def respond(prompt, sp):
        if prompt.endswith("more:"):
            started.wait()  # all three second-round gens must be in flight at once
        return prompt[-6:-4]

    fake = FakeBackend(respond=respond)

    @rf.function
    def branches(s):
        s += "P"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f" b{i}:" + rf.gen("x", max_tokens=2)
        firsts = [f["x"] for f in forks]  # runs the parent stretch with all three branches
        for f in forks:
            f += " more:" + rf.gen("y", max_tokens=2)
        s += "|".join(firsts)
        forks.join("gather")

    state = branches.run(backend=fake)
    assert state["x"] == ["P", "P", "P"] and len(state["y"]) == 3
    assert len(fake.programs) == 1 + 3


def test_branches_read_one_after_the_other_run_concurrently():
    started = threading.Barrier(3, timeout=10)

    def respond(prompt, sp):
        if prompt.endswith("more:"):
            started.wait()  # reading branch 0 starts its siblings' second gens too
        return "!"

    fake = FakeBackend(respond=respond)

    @rf.function
    def read_in_turn(s):
        forks = s.fork(3)
        forks += "first:" + rf.gen("x", max_tokens=1)
        forks[0]["x"]
        forks += " more:" + rf.gen("y", max_tokens=1)
        s += "".join(f["y"] for f in forks)

    assert read_in_turn.run(backend=fake).text() == "!!!"
    assert len(fake.programs) == 1 + 3


def test_eager_concat_join_appends_only_each_branch_s_new_text():
    fake = FakeBackend(respond=lambda p, sp: "!")

    @rf.function
    def prog(s):
        s += "Start"
        forks = s.fork(2)
        forks += "+" + rf.gen("g", max_tokens=1)
        forks[0]["g"]  # runs the fork now; the join below is then client-side
        s += " mid"
        forks.join("concat")

    assert prog.run(backend=fake).text() == "Start mid+!+!"


def test_a_failing_branch_reports_its_index_and_the_others_finish():
    fake = FakeBackend(fail_on=lambda body: "b1" in body.get("text", ""))
    captured = {}

    @rf.function
    def prog(s):
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"b{i}" + rf.gen("x", max_tokens=7)
        captured["forks"] = forks

    state = prog.run(backend=fake)
    assert state.ok  # no join: the parent does not depend on the branches
    forks = captured["forks"]
    assert forks[0]["x"] == " answer" and forks[2]["x"] == " answer"
    with pytest.raises(rf.BranchError, match="fork branch 1 failed.*scripted failure") as info:
        forks[1]["x"]
    assert info.value.index == 1
    with pytest.raises(rf.ForkError, match="branch 1") as info:
        forks.join()
    assert list(info.value.errors) == [1]


def test_lazy_join_over_a_failed_branch_fails_the_parent_with_fork_error():
    fake = FakeBackend(fail_on=lambda body: "B1" in body.get("text", ""))
    with pytest.raises(rf.ForkError, match="branch 1"):
        tree.run(mode="gather", backend=fake)


def test_run_batch_keeps_order_reports_failures_by_index_and_goes_on():
    fake = FakeBackend(respond=lambda p, sp: p.split("Topic: ")[1][:4],
                       fail_on=lambda body: "boom" in str(body.get("text")))
    topics = ["cats", "dogs", "boom", "fish", "owls"]
    states = two_gens.run_batch([{"topic": t} for t in topics], backend=fake, num_threads=3,
                                progress_bar=True)
    assert [s.ok for s in states] == [True, True, False, True, True]
    assert [s["a"] for i, s in enumerate(states) if i != 2] == ["cats", "dogs", "fish", "owls"]
    assert states[2].error.index == 2
    with pytest.raises(rf.ProgramError, match="program 2 of run_batch failed"):
        states[2]["a"]
    assert two_gens.run_batch([], backend=fake) == []
    with pytest.raises(rf.InvalidRequest, match="list of dicts"):
        two_gens.run_batch(["cats"], backend=fake)


def test_run_batch_generator_style_yields_in_order_as_programs_finish():
    release = threading.Event()

    def respond(prompt, sp):
        if "slow" in prompt:
            assert release.wait(30)
        return prompt.split("Topic: ")[1][:4]

    fake = FakeBackend(respond=respond)
    topics = ["fast", "slow", "more"]
    states = two_gens.run_batch([{"topic": t} for t in topics], backend=fake, num_threads=3,
                                generator_style=True)
    assert not isinstance(states, list)
    first = next(states)  # program 0 is done while program 1 still waits
    assert first["a"] == "fast" and not release.is_set()
    release.set()
    assert [s["a"] for s in states] == ["slow", "more"]
    assert list(two_gens.run_batch([], backend=fake, generator_style=True)) == []
    with pytest.raises(rf.InvalidRequest, match="generator_style=True is for run_batch"):
        asyncio.run(two_gens.arun_batch([{"topic": "x"}], backend=fake, generator_style=True))


def test_run_wide_logprob_options_reach_every_gen_that_sets_none():
    """SGLang's run(return_logprob=, logprob_start_len=, top_logprobs_num=) keywords."""
    @rf.function
    def two(s):
        s += "A:" + rf.gen("a", max_tokens=2)
        s += "B:" + rf.gen("b", max_tokens=2, return_logprob=True, top_logprobs_num=5)

    fake = FakeBackend()
    state = two.run(backend=fake, return_logprob=True, top_logprobs_num=2, logprob_start_len=1,
                    return_text_in_logprobs=True)
    gens = [c for c in fake.calls if c.get("sampling_params", {}).get("max_new_tokens") == 2]
    assert [(c["return_logprob"], c["top_logprobs_num"], c["logprob_start_len"])
            for c in gens] == [(True, 2, 1), (True, 5, 1)]
    assert state.get_meta_info("a")["output_token_logprobs"]
    fake.calls.clear()
    two.run_batch([{}, {}], backend=fake, return_logprob=True)
    assert all(c["return_logprob"] for c in fake.calls
               if c.get("sampling_params", {}).get("max_new_tokens") == 2)
    fake.calls.clear()
    two.run(backend=fake)
    firsts = [c for c in fake.calls if c.get("sampling_params", {}).get("max_new_tokens") == 2]
    assert "return_logprob" not in firsts[0] and firsts[1]["return_logprob"]
    with pytest.raises(rf.InvalidRequest, match="always gives each logprob's token text"):
        two.run(backend=fake, return_text_in_logprobs=False)


@rf.function
def few_shot(s, question):
    s += rf.system("You classify sentiment. " * 4)
    s += "Examples: great -> positive; awful -> negative; fine -> neutral.\n"
    s += rf.user(question)
    s += rf.assistant(rf.select("label", choices=["positive", "negative", "neutral"]))


def test_run_batch_sends_the_static_prefix_once_first():
    fake = FakeBackend()
    few_shot.run_batch([{"question": "I love it"}, {"question": "meh"}], backend=fake)
    assert len(fake.prefixes) == 1
    prefix = fake.prefixes[0]
    assert fake.calls[0]["text"] == prefix  # before any program's request
    assert prefix.endswith("neutral.\n<|im_start|>user\n")
    assert all(c["text"].startswith(prefix) for c in fake.calls[1:] if isinstance(c["text"], str))


def test_streaming_yields_text_as_it_is_generated():
    fake = FakeBackend(respond=lambda p, sp: "abcd")
    state = two_gens.run(topic="t", backend=fake, stream=True)
    assert list(state.text_iter("a")) == ["a", "b", "c", "d"]
    state.sync()
    assert "".join(two_gens.run(topic="t", backend=fake, stream=True).text_iter()) == \
        "Topic: t\nA:abcd\nB:abcd"
    assert list(two_gens.run(topic="t", backend=fake).text_iter("b")) == ["abcd"]


def test_streamed_program_errors_surface_from_text_iter():
    fake = FakeBackend(fail_on=lambda body: "B:" in body.get("text", ""))
    state = two_gens.run(topic="t", backend=fake, stream=True)
    with pytest.raises(RuntimeError, match="scripted failure"):
        list(state.text_iter())


def test_programs_compose_and_default_backend_is_used():
    fake = FakeBackend()

    @rf.function
    def inner(s, x):
        s += x + rf.gen("inner", max_tokens=2)

    @rf.function
    def outer(s):
        inner(s, "hello")
        s += "."

    rf.set_default_backend(fake)
    try:
        assert outer.run().text() == "hello a."  # max_tokens=2 characters
    finally:
        rf.set_default_backend(None)
    with pytest.raises(rf.errors.NoBackendError, match="set_default_backend"):
        outer.run()


def test_nested_forks_fail_cleanly_when_the_server_is_gone():
    class Gone(FakeBackend):
        def run_program(self, program, **kw):
            raise rf.ServerUnavailable("cannot reach the radixflow server at http://x")

    captured = {}

    @rf.function
    def nested(s):
        outer = s.fork(2)
        inner = outer[0].fork(2)
        inner += rf.gen("leaf", max_tokens=2)
        captured["inner"] = inner

    with pytest.raises(rf.ServerUnavailable, match="http://x"):
        nested.run(backend=Gone())
    with pytest.raises(rf.BranchError, match="did not run: ServerUnavailable"):
        captured["inner"][1]["leaf"]


def test_nested_forks_run_in_one_stretch():
    fake = FakeBackend(respond=lambda p, sp: p[-2:])

    @rf.function
    def nested(s):
        s += "R"
        outer = s.fork(2)
        for i, branch in enumerate(outer):
            branch += f"o{i}"
            inner = branch.fork(2)
            for j, leaf in enumerate(inner):
                leaf += f"i{j}" + rf.gen("leaf", max_tokens=2)
            inner.join("concat")
        outer.join("concat")

    state = nested.run(backend=fake)
    assert len(fake.programs) == 1
    assert state.text() == "Ro0i0i0i1i1o1i0i0i1i1"


def test_what_a_branch_gets_after_a_lazy_join_is_not_joined():
    fake = FakeBackend(respond=lambda p, sp: "!")

    @rf.function
    def prog(s):
        s += "S"
        forks = s.fork(2)
        forks += "a" + rf.gen("x", max_tokens=1)
        forks.join("concat")
        forks += "b" + rf.gen("y", max_tokens=1)
        s += "."
        return forks

    captured = {}

    @rf.function
    def outer(s):
        captured["forks"] = prog(s)

    state = outer.run(backend=fake)
    assert state.text() == "Sa!a!."
    assert [f.text() for f in captured["forks"]] == ["Sa!b!", "Sa!b!"]
