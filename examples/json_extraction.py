"""JSON-Schema extraction: one record per text, the schema taken from a pydantic model, the
output held to it by constrained decoding, all texts run as one batch; it reports how many
records are valid.

    python examples/json_extraction.py [--url http://127.0.0.1:30000]
    python examples/json_extraction.py --num-docs 100    # 100 generated documents
"""

from __future__ import annotations

import argparse
import random

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


FIRST = ["Alice", "Carlos", "Mei", "John", "Fatima", "Lars", "Priya", "Tomas", "Yuki", "Amara"]
LAST = ["Martin", "Ruiz", "Chen", "Okafor", "Haddad", "Berg", "Nair", "Novak", "Sato", "Diallo"]
CITIES = ["London", "Berlin", "Shanghai", "Lagos", "Cairo", "Oslo", "Mumbai", "Prague", "Osaka",
          "Dakar"]
SHAPES = ["{name} is {age} years old and lives in {city}.",
          "At {age}, {name} works as a nurse in {city}.",
          "{name} ({age}) moved to {city} last spring.",
          "Meet {name}: {age} years old, living in {city}, fond of chess."]


def generated_texts(n: int, seed: int = 0) -> list[str]:
    """`n` short documents that each describe one person."""
    rng = random.Random(seed)
    return [rng.choice(SHAPES).format(name=f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                                      age=rng.randint(18, 90), city=rng.choice(CITIES))
            for _ in range(n)]


@rf.function
def extract(s, text: str):
    s += rf.system("Extract the person described in the text as JSON with the fields "
                   "name, age and city (the city they live in now).")
    s += rf.user(text)
    s += rf.assistant(rf.gen("person", json_schema=Person, max_tokens=64, temperature=0))


def main(backend=None, *, texts=TEXTS, show: bool = True) -> list[Person | None]:
    """One Person per text (None where the output does not validate); prints the valid rate."""
    states = extract.run_batch([{"text": t} for t in texts], backend=backend, progress_bar=show)
    people: list[Person | None] = []
    for state in states:
        try:
            people.append(Person.model_validate_json(state["person"]))
        except pydantic.ValidationError:
            people.append(None)
    if show:
        for text, person in zip(texts, people):
            print(f"{text}\n  -> {person.model_dump() if person else 'INVALID'}")
    valid = sum(p is not None for p in people)
    print(f"valid records: {valid}/{len(texts)} ({100 * valid / len(texts):.0f}%)")
    return people


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a radixflow server (default: the model in-process)")
    parser.add_argument("--num-docs", type=int, help="extract from this many generated documents")
    cli = parser.parse_args()
    backend = rf.Endpoint(cli.url) if cli.url else rf.Engine()
    try:
        if cli.num_docs:
            main(backend, texts=generated_texts(cli.num_docs), show=False)
        else:
            main(backend)
    finally:
        backend.shutdown()
