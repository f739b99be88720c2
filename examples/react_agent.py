"""A ReAct agent: the model thinks, picks a tool with `select`, writes the tool's input under
a regex, and Python runs the tool (a calculator, or a search over a small local knowledge base).

    python examples/react_agent.py                       # in-process default model
    python examples/react_agent.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import ast
import operator

import radixflow as rf

KNOWLEDGE = {
    "eiffel tower": "The Eiffel Tower is 330 metres tall and stands in Paris.",
    "france": "France is a country in Europe; its capital is Paris.",
    "paris": "Paris is the capital of France, with about 2.1 million inhabitants.",
    "mount everest": "Mount Everest is 8849 metres high.",
    "python": "Python is a programming language created by Guido van Rossum in 1991.",
}
ACTIONS = ["calculator", "search", "finish"]
ARITHMETIC = r"[0-9][0-9+\-*/(). ]{0,30}"
QUERY = r"[a-z][a-z ]{0,24}"

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg,
        ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Evaluate + - * / ** and parentheses over numbers; never calls Python's eval."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(walk(node.right)) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression {ast.dump(node)[:40]}")

    try:
        value = walk(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def search(query: str) -> str:
    """The best entry of the knowledge base: the one sharing the most words with the query."""
    words = set(query.lower().split())
    best = max(KNOWLEDGE, key=lambda key: len(words & set(key.split())))
    return KNOWLEDGE[best] if words & set(best.split()) else "no result"


TOOLS = {"calculator": calculator, "search": search}
SYSTEM = """You solve tasks with tools: calculator (arithmetic), search (facts about places and \
things), finish (give the final answer). Example:
Question: How high is Mount Everest in km?
Thought: I need the height first.
Action: search
Input: mount everest
Observation: Mount Everest is 8849 metres high.
Thought: Now convert metres to km.
Action: calculator
Input: 8849 / 1000
Observation: 8.849
Thought: I know the answer.
Action: finish
Input: about 8.8 km"""


@rf.function
def react(s, question: str, max_steps: int = 3):
    s += rf.system(SYSTEM)
    s += rf.user(question)
    for step in range(max_steps):
        with s.assistant():
            s += "Thought:" + rf.gen("thought", max_tokens=32, stop="\n") + "\nAction: "
            # A 135M model likes to answer at once; the first step must use a tool.
            s += rf.select("action", choices=ACTIONS if step else ACTIONS[:2])
            s += "\nInput: "
            action = s["action"]  # Python decides: the stretch ends here
            if action == "finish":
                s += rf.gen("answer", max_tokens=32, stop="\n")
                return
            s += rf.gen("input", regex=ARITHMETIC if action == "calculator" else QUERY,
                        max_tokens=16)
        s += rf.user("Observation: " + TOOLS[action](s["input"]))
    with s.assistant():
        s += "Final answer:" + rf.gen("answer", max_tokens=32, stop="\n")


QUESTIONS = ["Use the calculator to compute 17 * 23 + 4.", "Search: how tall is the Eiffel Tower?"]


def main(backend=None, *, questions=QUESTIONS, max_steps: int = 3) -> list[rf.ProgramState]:
    states = react.run_batch([{"question": q, "max_steps": max_steps} for q in questions],
                             backend=backend, temperature=0)
    for question, state in zip(questions, states):
        print(f"Q: {question}")
        for message in state.messages()[2:]:
            print(f"  {message['role']}: {message['content']}")
        print(f"  -> {state.get_var('answer')!r}\n")
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
