"""`rf.gen(..., reasoning=True)` on a reasoning model (--reasoning-parser deepseek-r1, a tiny
random model with Qwen3's tokenizer): the variable and the program's text get the answer, which
the regex holds; the thinking goes to `<name>_reasoning_content` and to the meta info. The
server path (/program) is in tests/runtime/server/test_reasoning_http.py."""

from __future__ import annotations

import pytest
import regex
from helpers.thinking_model import make_thinking_model

import radixflow as rf
from radixflow.runtime.errors import InvalidRequest

DIGITS = "[0-9]{3}"


@pytest.fixture(scope="module")
def thinking_engine(tmp_path_factory):
    folder = make_thinking_model(tmp_path_factory.mktemp("thinking-dsl"))
    engine = rf.Engine(str(folder), reasoning_parser="deepseek-r1", dtype="float32",
                       max_total_tokens=2048)
    yield engine
    engine.shutdown()


@rf.function
def pick(s, separate=True):
    s += "Pick a number: "
    s += rf.gen("n", regex=DIGITS, reasoning=separate, thinking_budget=3, max_tokens=20,
                temperature=0)
    s += "\nAgain: "
    s += rf.gen("m", regex=DIGITS, separate_reasoning=separate, thinking_budget=0,
                max_tokens=20, temperature=0)


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_is_the_variable_and_the_thinking_apart(thinking_engine, stream):
    s = pick.run(backend=thinking_engine, stream=stream)
    if stream:
        s.sync()
    assert regex.fullmatch(DIGITS, s["n"]) and regex.fullmatch(DIGITS, s["m"])
    meta = s.get_meta_info("n")
    assert s["n_reasoning_content"] == meta["reasoning_text"]
    assert 1 <= meta["reasoning_tokens"] <= 4  # at most 3 thinking tokens and </think>
    assert s["m_reasoning_content"] == ""  # a budget of 0: the marker came first
    assert s.text() == f"Pick a number: {s['n']}\nAgain: {s['m']}"


def test_a_budget_without_reasoning_keeps_the_thinking_in_the_variable(thinking_engine):
    s = pick.run(separate=False, backend=thinking_engine)
    # a thinking_budget alone still thinks first; the variable then holds the whole text
    thinking, answer = s["n"].split("</think>")
    assert regex.fullmatch(DIGITS, answer) and s["m"].startswith("</think>")
    assert "n_reasoning_content" not in s.variables()


def test_a_negative_budget_is_refused():
    with pytest.raises(InvalidRequest, match="thinking_budget"):
        rf.gen("x", reasoning=True, thinking_budget=-1)
