"""A multi-turn chat rendered with the model's own chat template; answers stream as they
are generated, and every turn reuses the cached conversation before it.

    python examples/multi_turn_chat.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import argparse
import sys

import radixflow as rf

TURNS = ["What is the capital of France?", "And what river runs through it?",
         "Name one famous museum there."]


@rf.function
def chat(s, turns: list[str], max_tokens: int = 48):
    s += rf.system("You are a helpful assistant. Answer in one short sentence.")
    for i, question in enumerate(turns):
        s += rf.user(question)
        s += rf.assistant(rf.gen(f"answer_{i}", max_tokens=max_tokens, temperature=0))


def main(backend=None, *, turns=TURNS, max_tokens: int = 48) -> rf.ProgramState:
    state = chat.run(turns=turns, max_tokens=max_tokens, backend=backend, stream=True)
    for i, question in enumerate(turns):
        print(f"user: {question}\nassistant: ", end="", flush=True)
        for chunk in state.text_iter(f"answer_{i}"):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        print()
    return state.sync()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a radixflow server (default: the model in-process)")
    cli = parser.parse_args()
    backend = rf.Endpoint(cli.url) if cli.url else rf.Engine()
    try:
        main(backend)
    finally:
        backend.shutdown()
