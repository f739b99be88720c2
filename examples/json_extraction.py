"""JSON-Schema extraction: one record per text, the schema taken from a pydantic model, the
output held to it by constrained decoding, all texts run as one batch.

    python examples/json_extraction.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import argparse

import pydantic

import radixflow as rf


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int = pydantic.Field(ge=0, le=130)
    city: str = pydantic.Field(max_length=24)


TEXTS = [
    "Alice Martin is 34 years old and lives in London, where she teaches chemistry.",
    "Born in 1990 in Madrid, Carlos Ruiz (now 35) moved to Berlin for work.",
    "Our new neighbour, Mei Chen, is a 28-year-old architect from Shanghai.",
    "At 61, retired pilot John Okafor enjoys the quiet life in Lagos.",
]


@rf.function
def extract(s, text: str):
    s += rf.system("Extract the person described in the text as JSON with the fields "
                   "name, age and city (the city they live in now).")
    s += rf.user(text)
    s += rf.assistant(rf.gen("person", json_schema=Person, max_tokens=64, temperature=0))


def main(backend=None, *, texts=TEXTS) -> list[Person]:
    states = extract.run_batch([{"text": t} for t in texts], backend=backend, progress_bar=True)
    people = [Person.model_validate_json(state["person"]) for state in states]
    for text, person in zip(texts, people):
        print(f"{text}\n  -> {person.model_dump()}")
    return people


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a radixflow server (default: the model in-process)")
    cli = parser.parse_args()
    backend = rf.Endpoint(cli.url) if cli.url else rf.Engine()
    try:
        main(backend)
    finally:
        backend.shutdown()
