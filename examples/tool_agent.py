"""A ReAct loop through tool calls: each step the model calls one of its tools (a calculator,
a search over a small local knowledge base, or finish) as a JSON call held to the tool's
argument schema by constrained decoding, and Python runs the call.

    python examples/tool_agent.py                       # in-process default model
    python examples/tool_agent.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import radixflow as rf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from react_agent import calculator, search  # noqa: E402 -- the same real tools


def finish(answer: str) -> str:
    """Give the final answer."""
    return answer


TOOLS = [calculator, search, finish]
SYSTEM = """You solve tasks by calling tools, one call per step, as JSON: \
[{"name": "calculator", "arguments": {"expression": "2 * 21"}}] computes arithmetic, \
[{"name": "search", "arguments": {"query": "mount everest"}}] looks facts up, \
[{"name": "finish", "arguments": {"answer": "42"}}] gives the final answer."""


@rf.function
def agent(s, question: str, max_steps: int = 3):
    s += rf.system(SYSTEM)
    s += rf.user(question)
    for _ in range(max_steps):
        s += rf.assistant(rf.gen("calls", tools=TOOLS, parallel_tool_calls=False,
                                 max_tokens=48))
        (call,) = s["calls"]  # parsed: {"name": ..., "arguments": {...}}
        if call["name"] == "finish":
            return
        (observation,) = rf.call_tools(s["calls"], TOOLS)  # runs calculator / search
        s += rf.user(f"Observation: {observation}")


QUESTIONS = ["What is 17 * 23 + 4?", "How tall is the Eiffel Tower?"]


def main(backend=None, *, questions=QUESTIONS, max_steps: int = 3) -> list[rf.ProgramState]:
    states = agent.run_batch([{"question": q, "max_steps": max_steps} for q in questions],
                             backend=backend, temperature=0)
    for question, state in zip(questions, states):
        print(f"Q: {question}")
        for message in state.messages()[2:]:
            print(f"  {message['role']}: {message['content']}")
        print()
    return states


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a radixflow server (default: the model in-process)")
    cli = parser.parse_args()
    backend = rf.Endpoint(cli.url) if cli.url else rf.Engine()
    try:
        main(backend)
    finally:
        backend.shutdown()
