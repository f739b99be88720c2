"""DSL features for agents, on the in-process Engine and on a live server: tool-call gens,
n samples in one gen, stop_regex, and async programs."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import jsonschema
import pytest

import radixflow as rf

GREEDY = {"temperature": 0}


def paint(color: Literal["red", "green", "blue"], shiny: bool = False) -> str:
    return f"{'shiny ' if shiny else ''}{color}"


def switch(on: bool) -> str:
    return "on" if on else "off"


@rf.function
def act(s, task, parallel=True):
    s += "Task: " + task + "\nCalls: "
    s += rf.gen("calls", tools=[paint, switch], parallel_tool_calls=parallel, max_tokens=80,
                **GREEDY)


def test_a_tool_gen_returns_parsed_calls_that_follow_the_schemas(backend):
    from radixflow.tools import as_tools

    schemas = {t.name: json.loads(t.parameters) for t in as_tools([paint, switch])}
    one = act.run(task="paint the wall", parallel=False, backend=backend)
    (call,) = one["calls"]
    jsonschema.validate(call["arguments"], schemas[call["name"]])
    assert json.loads(one.text().split("Calls: ", 1)[1]) == one["calls"]  # the text is the JSON
    (result,) = rf.call_tools(one["calls"], [paint, switch])
    assert result == (paint if call["name"] == "paint" else switch)(**call["arguments"])
    many = act.run(task="paint the wall", backend=backend)["calls"]
    assert len(many) >= 1
    for call in many:
        jsonschema.validate(call["arguments"], schemas[call["name"]])


def test_tool_schemas_come_from_signatures_and_openai_dicts():
    from radixflow.tools import as_tools

    (p, d) = as_tools([paint, {"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object", "properties": {
            "word": {"type": "string"}}, "required": ["word"]}}}])
    schema = json.loads(p.parameters)
    assert schema["properties"]["color"]["enum"] == ["red", "green", "blue"]
    assert schema["required"] == ["color"] and schema["additionalProperties"] is False
    assert d.name == "lookup" and d.func is None
    with pytest.raises(rf.InvalidRequest, match="unique"):
        as_tools([paint, paint])
    with pytest.raises(rf.InvalidRequest, match="no Python function"):
        rf.call_tools([{"name": "lookup", "arguments": {"word": "x"}}], [d])
    with pytest.raises(rf.InvalidRequest, match="at most one"):
        rf.gen("x", tools=[paint], regex="a")


def test_n_samples_in_one_gen(backend):
    @rf.function
    def brainstorm(s):
        s += "Ideas:"
        s += rf.gen("ideas", n=3, max_tokens=5, temperature=1.0, seed=11)
        s += " done"

    state = brainstorm.run(backend=backend)
    ideas = state["ideas"]
    assert isinstance(ideas, list) and len(ideas) == 3 and all(isinstance(i, str) for i in ideas)
    assert state.text() == "Ideas: done"  # no one sample is appended
    assert len(state.get_meta_info("ideas")) == 3
    with pytest.raises(rf.InvalidRequest, match="n must be"):
        rf.gen("x", n=0)


def test_stop_regex_in_gen(backend):
    @rf.function
    def free(s):
        s += "Count:" + rf.gen("x", max_tokens=24, **GREEDY)

    @rf.function
    def cut(s, pattern):
        s += "Count:" + rf.gen("x", max_tokens=24, stop_regex=pattern, **GREEDY)

    full = free.run(backend=backend)["x"]
    assert len(full) > 4
    pattern = "[" + "".join(sorted(set(full[2:4]))).replace("]", r"\]").replace("\\", "\\\\") \
        .replace("^", r"\^").replace("-", r"\-") + "]"
    got = cut.run(pattern=pattern, backend=backend)["x"]
    import re

    first = re.search(pattern, full)
    assert got == full[:first.start()]


def test_async_programs(backend):
    @rf.function
    def hello(s, name):
        s += "Hello " + name + "," + rf.gen("rest", max_tokens=6, **GREEDY)

    async def main():
        states = await asyncio.gather(*(hello.arun(name=n, backend=backend)
                                        for n in ("Ada", "Bob", "Cy")))
        streamed = await hello.arun(name="Ada", backend=backend, stream=True)
        pieces = [piece async for piece in streamed.text_aiter("rest")]
        batch = await hello.arun_batch([{"name": "Ada"}, {"name": "Bob"}], backend=backend)
        return states, pieces, batch

    states, pieces, batch = asyncio.run(main())
    assert [s["rest"] for s in states[:2]] == [b["rest"] for b in batch]
    assert "".join(pieces) == states[0]["rest"]
