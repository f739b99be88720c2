"""The /program wire format and executor (radixflow.runtime.program), over a scripted model."""

from __future__ import annotations

import json

import pytest
from helpers.fake_backend import FakeBackend

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.program import ProgramExecutor, execute_program


def _gen(name, **sp):
    return {"type": "gen", "name": name, "sampling_params": {"max_new_tokens": 16, **sp}}


def test_straight_line_stretch_runs_in_order_with_the_text_so_far():
    fake = FakeBackend(respond=lambda p, sp: f"<{len(p)}>")  # 'Hi. A:' is 6 chars
    program = {"text": "Hi.", "nodes": [
        {"type": "text", "text": " A:"}, _gen("a"),
        {"type": "text", "text": " B:"}, _gen("b"),
    ]}
    result = execute_program(program, fake.generate_from_body)
    assert result["variables"] == {"a": "<6>", "b": "<12>"}
    assert result["text"] == " A:<6> B:<12>"
    assert result["pieces"] == [" A:", "<6>", " B:", "<12>"]
    assert [c["text"] for c in fake.calls] == ["Hi. A:", "Hi. A:<6> B:"]
    assert result["meta"]["num_requests"] == 2 and result["meta"]["prompt_tokens"] == 6 + 12
    assert result["error"] is None
    json.dumps(result)  # the server returns it as JSON


def test_gen_options_reach_generate():
    fake = FakeBackend(respond=lambda p, sp: "42")
    node = {**_gen("n", regex="[0-9]+", stop=["\n"]), "return_logprob": True,
            "return_text_in_logprobs": True, "logprob_start_len": 1}
    result = execute_program({"nodes": [{"type": "text", "text": "x="}, node]},
                             fake.generate_from_body)
    body = fake.calls[0]
    assert body["sampling_params"]["regex"] == "[0-9]+" and body["return_logprob"] is True
    assert body["logprob_start_len"] == 1
    assert result["meta_info"]["n"]["input_token_logprobs"][0][0] is None


def test_select_in_a_program():
    fake = FakeBackend(logprob=lambda prefix, c: -0.1 if c in "no" else -2.0)
    program = {"text": "Is it? ", "nodes": [
        {"type": "select", "name": "ans", "choices": ["yes", "no"]}, {"type": "text", "text": "!"}]}
    result = execute_program(program, fake.generate_from_body)
    assert result["variables"]["ans"] == "no"
    assert result["text"] == "no!"
    assert result["meta_info"]["ans"]["scores"] == pytest.approx([-2.0, -0.1])
    assert result["meta"]["num_requests"] == 2


def test_fork_runs_branches_and_join_gathers_or_concatenates():
    fake = FakeBackend(respond=lambda p, sp: p[-2:])
    fork = {"type": "fork", "branches": [
        [{"type": "text", "text": "#0"}, _gen("x")],
        [{"type": "text", "text": "#1"}, _gen("x"), _gen("y")],
    ]}
    gathered = execute_program({"text": "P", "nodes": [fork, {"type": "join", "mode": "gather"}]},
                               fake.generate_from_body)
    assert gathered["variables"] == {"x": ["#0", "#1"], "y": [None, "#1"]}
    assert [b["text"] for b in gathered["branches"][0]] == ["#0#0", "#1#1#1"]
    assert gathered["meta"]["num_requests"] == 3
    concat = execute_program({"text": "P", "nodes": [fork, {"type": "join", "mode": "concat"},
                                                     _gen("after")]}, fake.generate_from_body)
    assert concat["text"] == "#0#0#1#1#1" + "#1" and concat["variables"]["after"] == "#1"


def test_an_error_is_reported_in_band_with_the_text_before_it():
    fake = FakeBackend(fail_on=lambda body: body.get("text", "").endswith("B:"))
    program = {"nodes": [{"type": "text", "text": "A:"}, _gen("a"),
                         {"type": "text", "text": " B:"}, _gen("b"), _gen("c")]}
    result = execute_program(program, fake.generate_from_body)
    assert result["error"]["node"] == 3 and result["error"]["type"] == "RuntimeError"
    assert "scripted failure" in result["error"]["message"]
    assert result["text"] == "A: answer B:" and "b" not in result["variables"]
    json.dumps(result)


def test_a_failed_branch_does_not_stop_the_others_but_fails_the_join():
    fake = FakeBackend(fail_on=lambda body: "bad" in body.get("text", ""))
    fork = {"type": "fork", "branches": [[{"type": "text", "text": "ok"}, _gen("x")],
                                         [{"type": "text", "text": "bad"}, _gen("x")],
                                         [{"type": "text", "text": "ok2"}, _gen("x")]]}
    result = execute_program({"nodes": [fork]}, fake.generate_from_body)
    branches = result["branches"][0]
    assert [b["error"] is None for b in branches] == [True, False, True]
    assert branches[2]["variables"]["x"] == " answer"
    joined = execute_program({"nodes": [fork, {"type": "join"}]}, fake.generate_from_body)
    assert joined["error"]["type"] == "ForkError" and "branch 1" in joined["error"]["message"]


def test_streaming_reports_every_delta():
    fake = FakeBackend(respond=lambda p, sp: "abc")
    seen = []
    executor = ProgramExecutor(fake.generate_from_body, stream=True,
                               on_text=lambda n, d: seen.append((n, d)))
    result = executor.run({"text": "", "nodes": [{"type": "text", "text": "Q"}, _gen("a")]})
    assert seen == [(None, "Q"), ("a", "a"), ("a", "b"), ("a", "c")]
    assert result["variables"]["a"] == "abc" and fake.calls[0]["stream"] is True


@pytest.mark.parametrize("program, match", [
    ([], "JSON object"),
    ({"nodes": "x"}, "nodes must be a list"),
    ({"nodes": [{"type": "loop"}]}, "type"),
    ({"nodes": [{"type": "text"}]}, "string 'text'"),
    ({"nodes": [{"type": "select", "choices": []}]}, "non-empty list"),
    ({"nodes": [{"type": "select", "choices": ["a"], "method": "vote"}]}, "method"),
    ({"nodes": [{"type": "join"}]}, "no fork precedes"),
    ({"nodes": [{"type": "fork", "branches": []}]}, "branches"),
    ({"text": 3, "nodes": []}, "'text' must be a string"),
])
def test_malformed_programs_are_invalid_requests(program, match):
    with pytest.raises(InvalidRequest, match=match):
        execute_program(program, FakeBackend().generate_from_body)
