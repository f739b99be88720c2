"""Tree of thought with `fork`: several branches propose an approach from the same prefix
(computed once, shared through the radix cache), each judges its own idea with `select`, and
the parent continues from the branch the model rates best.

    python examples/tree_of_thought.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import argparse

import radixflow as rf


@rf.function
def tree_of_thought(s, question: str, num_branches: int = 3):
    s += rf.system("You are a careful problem solver.")
    s += rf.user(question)
    s += rf.assistant_begin()
    s += "Let me think about different approaches.\n"
    forks = s.fork(num_branches)
    for i, branch in enumerate(forks):
        branch += f"Approach {i + 1}:" + rf.gen("idea", max_tokens=40, stop="\n",
                                                temperature=0.8, seed=i)
        branch += "\nIs this approach correct? " + rf.select("verdict", choices=["yes", "no"])
    forks.join("gather")  # s["idea"], s["verdict"]: one entry per branch
    best = max(range(num_branches), key=lambda i: forks[i].scores("verdict")["yes"])
    s += f"The best approach: {s['idea'][best].strip()}\nFinal answer:"
    s += rf.gen("answer", max_tokens=40, stop="\n", temperature=0)
    s += rf.assistant_end()
    return best


QUESTION = "A farmer has 12 sheep and buys 3 more pens of 4 sheep each. How many sheep now?"


def main(backend=None, *, question: str = QUESTION, num_branches: int = 3) -> rf.ProgramState:
    state = tree_of_thought.run(question=question, num_branches=num_branches, backend=backend)
    for i, (idea, verdict) in enumerate(zip(state["idea"], state["verdict"])):
        print(f"branch {i}: [{verdict}] {idea.strip()}")
    print(f"answer: {state['answer'].strip()}")
    return state


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a radixflow server (default: the model in-process)")
    cli = parser.parse_args()
    backend = rf.Endpoint(cli.url) if cli.url else rf.Engine()
    try:
        main(backend)
    finally:
        backend.shutdown()
