"""Seeded serving workloads for the load generator.

A workload is a list of sessions; a session is a list of chat turns sent one after another,
each re-sending the whole history (the assistant's real replies included). Single-turn
workloads have one turn per session. Sizes are in tokens of a typical BPE (about 1.3 tokens
per English word here); `scale` shrinks every prompt part, for smoke tests on tiny models.

| workload      | prompt                                                | output  | default  |
|---------------|-------------------------------------------------------|---------|----------|
| shared_prefix | ~1000-token shared system prompt + ~30-token question | 32      | (32, 16) |
| multi_turn    | conversations of 4 turns re-sending history           | 32/turn | (16, 8)  |
| random_short  | ~128 random tokens                                    | 64      | (32, 16) |
| few_shot      | ~800-token 5-shot prefix + question                   | 16      | (16, 8)  |
| json_extract  | ~170-token profile, JSON Schema response_format       | <=128   | (32, 16) |

Defaults are (requests, concurrency); json_extract's outputs are validated against its schema.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOKENS_PER_WORD = 1.3

WORDS = ["time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part",
         "child", "eye", "woman", "place", "work", "week", "case", "point", "government", "company",
         "number", "group", "problem", "fact", "river", "mountain", "city", "music", "science",
         "history", "garden", "window", "market", "winter", "summer", "friend", "teacher",
         "student", "doctor", "engine", "planet", "ocean", "forest", "animal", "bridge", "castle",
         "paper", "water", "light", "sound", "color", "letter", "table", "house", "road", "story",
         "question", "answer", "system", "program", "memory", "model", "cache", "token", "prefix",
         "language", "value", "string", "travel", "follow", "begin", "bring", "write", "stand",
         "learn", "change", "lead", "watch", "speak", "read", "grow", "open", "walk", "offer",
         "remember", "consider", "appear", "buy", "wait", "serve", "send", "build", "stay", "fall",
         "reach", "remain", "suggest", "raise", "pass", "sell", "require", "report", "decide",
         "pull", "happy", "small", "large", "early", "young", "important", "public", "private",
         "social", "national", "local", "certain", "able", "clear", "simple", "strong", "recent",
         "free", "human", "whole", "special", "real", "best", "better"]

NAMES = ["Alice", "Bob", "Carmen", "Dmitri", "Emeka", "Fatima", "Goran", "Hana", "Ivan", "Jia",
         "Kofi", "Lena", "Mateo", "Noor", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tariq"]
CITIES = ["London", "Paris", "Lagos", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Rome",
          "Seoul", "Kyiv", "Accra", "Hanoi", "Bern", "Dhaka"]
HOBBIES = ["chess", "hiking", "painting", "cycling", "baking", "sailing", "poetry", "gardening",
           "running", "photography", "climbing", "knitting"]


@dataclass
class Turn:
    user: str
    max_tokens: int
    ignore_eos: bool = True  # fixed output length, so servers are compared on equal work
    response_format: dict | None = None


@dataclass
class Session:
    turns: list[Turn]
    system: str | None = None
    validate: Callable[[str], str | None] | None = None  # output -> problem, or None if valid


@dataclass
class Workload:
    name: str
    sessions: list[Session]
    concurrency: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def words(rng: random.Random, num_tokens: int) -> str:
    n = max(1, round(num_tokens / TOKENS_PER_WORD))
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _sentences(rng: random.Random, num_tokens: int) -> str:
    out, left = [], num_tokens
    while left > 0:
        n = min(left, rng.randint(10, 20))
        out.append(words(rng, n).capitalize() + ".")
        left -= n
    return " ".join(out)


def _size(tokens: int, scale: float) -> int:
    return max(1, round(tokens * scale))


def shared_prefix(num: int, seed: int, scale: float = 1.0) -> list[Session]:
    rng = random.Random(seed)
    system = ("You are a support assistant for a large library. Use the reference notes below "
              "to answer.\n" + _sentences(rng, _size(1000, scale)))
    return [Session(system=system, turns=[Turn(
        user=f"Question {i}: " + words(rng, _size(30, scale)) + "?", max_tokens=32)])
        for i in range(num)]


def multi_turn(num: int, seed: int, scale: float = 1.0, turns: int = 4) -> list[Session]:
    rng = random.Random(seed)
    return [Session(system="You are a helpful assistant. " + _sentences(rng, _size(80, scale)),
                    turns=[Turn(user=words(rng, _size(60, scale)) + "?", max_tokens=32)
                           for _ in range(turns)])
            for _ in range(num)]


def random_short(num: int, seed: int, scale: float = 1.0) -> list[Session]:
    rng = random.Random(seed)
    return [Session(turns=[Turn(user=words(rng, _size(128, scale)), max_tokens=64)])
            for _ in range(num)]


def few_shot(num: int, seed: int, scale: float = 1.0) -> list[Session]:
    rng = random.Random(seed)
    shots = []
    for k in range(5):
        question = _sentences(rng, _size(120, scale))
        shots.append(f"Example {k + 1}:\nText: {question}\nTopic: {rng.choice(WORDS)}")
    prefix = ("Read each text and name its topic in one word.\n\n" + "\n\n".join(shots) + "\n\n")
    return [Session(turns=[Turn(
        user=prefix + f"Text: {_sentences(rng, _size(30, scale))}\nTopic:", max_tokens=16)])
        for _ in range(num)]


PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        # Bounded strings, as a real extraction schema has: a 135M model can loop inside an
        # unbounded string until max_tokens and never close the JSON.
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20},
                    "maxItems": 4},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}


def validate_profile(output: str) -> str | None:
    import jsonschema

    try:
        value = json.loads(output)
    except ValueError as exc:
        return f"not JSON: {exc}"
    try:
        jsonschema.validate(value, PROFILE_SCHEMA)
    except jsonschema.ValidationError as exc:
        return f"schema violation: {exc.message}"
    return None


def json_extract(num: int, seed: int, scale: float = 1.0) -> list[Session]:
    rng = random.Random(seed)
    fmt = {"type": "json_schema",
           "json_schema": {"name": "profile", "schema": PROFILE_SCHEMA, "strict": True}}
    sessions = []
    for _ in range(num):
        name, city = rng.choice(NAMES), rng.choice(CITIES)
        hobbies = rng.sample(HOBBIES, 2)
        text = (f"{_sentences(rng, _size(60, scale))} {name} is {rng.randint(18, 90)} years old "
                f"and lives in {city}. {_sentences(rng, _size(50, scale))} In their free time "
                f"they enjoy {hobbies[0]} and {hobbies[1]}.")
        sessions.append(Session(validate=validate_profile, turns=[Turn(
            user=f"Extract the person's name, age, city and hobbies as JSON.\n\n{text}",
            max_tokens=192, ignore_eos=False, response_format=fmt)]))
    return sessions


# name -> (builder, default sessions, default concurrency)
WORKLOADS: dict[str, tuple[Callable[..., list[Session]], int, int]] = {
    "shared_prefix": (shared_prefix, 32, 16),
    "multi_turn": (multi_turn, 16, 8),
    "random_short": (random_short, 32, 16),
    "few_shot": (few_shot, 16, 8),
    "json_extract": (json_extract, 32, 16),
}


def build(name: str, *, num_sessions: int | None = None, concurrency: int | None = None,
          seed: int = 0, scale: float = 1.0, max_tokens: int | None = None) -> Workload:
    """The workload `name`, seeded. `max_tokens` overrides every turn's output length."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    builder, default_num, default_conc = WORKLOADS[name]
    sessions = builder(num_sessions or default_num, seed, scale)
    if max_tokens is not None:
        for s in sessions:
            for t in s.turns:
                t.max_tokens = max_tokens
    return Workload(name=name, sessions=sessions, concurrency=concurrency or default_conc,
                    meta={"seed": seed, "scale": scale, "max_tokens": max_tokens})
