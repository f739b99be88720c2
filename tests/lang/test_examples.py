"""The examples in examples/, run on the default model (e2e), plus their tools (no model)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import radixflow as rf

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"rf_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_react_tools_without_a_model():
    react = load("react_agent")
    assert react.calculator("17 * 23 + 4") == "395"
    assert react.calculator("(1 + 2) / 4") == "0.75"
    assert react.calculator("2 ** 1000").startswith("error")
    assert react.calculator("__import__('os')").startswith("error")
    assert react.calculator("1 / 0").startswith("error")
    assert "330 metres" in react.search("eiffel tower height")
    assert react.search("quantum chromodynamics") == "no result"
    graph = react.react.trace(question="q", max_steps=2)
    assert graph.kinds().count("select") == 1  # tracing stops at the tool call on a placeholder


@pytest.fixture(scope="module")
def default_engine():
    backend = rf.Engine()
    yield backend
    backend.shutdown()


@pytest.mark.e2e
def test_react_agent(default_engine):
    react = load("react_agent")
    states = react.main(default_engine, max_steps=2)
    for state in states:
        assert state.ok
        text = state.text()
        actions = re.findall(r"Action: (\w+)", text)
        assert set(actions) <= {"calculator", "search", "finish"}
        assert "Observation: " in text  # the first step always calls a tool
        for tool_input in re.findall(r"Action: calculator\nInput: (.*)<\|im_end\|>", text):
            assert re.fullmatch(react.ARITHMETIC, tool_input)
        assert isinstance(state["answer"], str)


@pytest.mark.e2e
def test_json_extraction(default_engine):
    example = load("json_extraction")
    people = example.main(default_engine)  # validates every record against the schema
    assert None not in people
    ages = [p.age for p in people]
    assert sum(a == b for a, b in zip(ages, [34, 35, 28, 61])) >= 3


@pytest.mark.e2e
def test_json_extraction_of_generated_documents_is_all_valid(default_engine):
    example = load("json_extraction")
    texts = example.generated_texts(24, seed=1)  # the example runs 100 with --num-docs 100
    people = example.main(default_engine, texts=texts, show=False)
    assert None not in people


@pytest.mark.e2e
def test_tool_agent(default_engine):
    import sys

    sys.path.insert(0, str(EXAMPLES))  # it imports its tools from react_agent
    example = load("tool_agent")
    states = example.main(default_engine, max_steps=2)
    for state in states:
        assert state.ok
        calls = [m["content"] for m in state.messages() if m["role"] == "assistant"]
        assert calls and all(c.startswith("[{\"name\": ") for c in calls)
        observations = [m["content"] for m in state.messages() if m["role"] == "user"][1:]
        assert all(o.startswith("Observation: ") for o in observations)


@pytest.mark.e2e
def test_few_shot_classification(default_engine):
    example = load("few_shot_classification")
    states = example.main(default_engine)
    labels = [s["label"] for s in states]
    assert set(labels) <= set(example.LABELS)
    gold = [g for _, g in example.REVIEWS]
    assert sum(a == b for a, b in zip(labels, gold)) >= 3


@pytest.mark.e2e
def test_tree_of_thought(default_engine):
    example = load("tree_of_thought")
    state = example.main(default_engine, num_branches=3)
    assert len(state["idea"]) == 3 and set(state["verdict"]) <= {"yes", "no"}
    assert state["answer"].strip()
    assert state.messages()[-1]["role"] == "assistant"


@pytest.mark.e2e
def test_multi_turn_chat(default_engine):
    example = load("multi_turn_chat")
    state = example.main(default_engine, turns=example.TURNS[:2], max_tokens=24)
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert "Paris" in state["answer_0"]
    assert all("<|im_end|>" not in state[f"answer_{i}"] for i in range(2))
