"""Every grammar in the corpus compiles, accepts its examples, rejects its counter-examples,
and every random walk through its token masks decodes to output that validates."""

from __future__ import annotations

import json
import re

import pytest
from helpers.constraint_corpus import load_grammars, load_regexes, load_schemas
from helpers.constraint_validators import GRAMMAR_EXAMPLES, grammar_ok, schema_errors
from helpers.grammar_walk import random_walk

SCHEMAS = load_schemas()
REGEXES = load_regexes()
GRAMMARS = load_grammars()
SEEDS = (0, 1)


def test_corpus_is_complete():
    assert len(SCHEMAS) >= 50
    assert all(isinstance(doc.get("description"), str) and doc["description"]
               for _, doc in SCHEMAS)
    assert len(REGEXES) >= 20
    assert len(GRAMMARS) >= 5
    assert set(GRAMMAR_EXAMPLES) == {name for name, _ in GRAMMARS}


def _matches(backend, compiled, text: str) -> bool:
    state = backend.new_state(compiled)
    return state.matcher.accept_string(text) and state.can_terminate()


# ---- JSON Schemas ----

@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_schema_examples(backend, name, schema):
    compiled = backend.compile("json_schema", json.dumps(schema))
    for example in schema["examples"]:
        assert schema_errors(schema, example) == []
        spaced = json.dumps(example, separators=(", ", ": "), ensure_ascii=False)
        compact = json.dumps(example, separators=(",", ":"), ensure_ascii=False)
        assert _matches(backend, compiled, spaced) or _matches(backend, compiled, compact), spaced


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_schema_random_walks_validate(backend, tokenizer, name, schema):
    compiled = backend.compile("json_schema", json.dumps(schema))
    for seed in SEEDS:
        jump_tokenizer = tokenizer if seed % 2 else None
        walk = random_walk(backend, backend.new_state(compiled), seed, tokenizer=jump_tokenizer)
        assert walk.terminated, f"seed {seed}: no end after {len(walk.output_ids)} tokens"
        text = walk.text(backend)
        assert schema_errors(schema, json.loads(text)) == [], text


# ---- regexes ----

@pytest.mark.parametrize("case", REGEXES, ids=[c["name"] for c in REGEXES])
def test_regex_examples(backend, case):
    compiled = backend.compile("regex", case["pattern"])
    for text in case["match"]:
        assert re.fullmatch(case["pattern"], text)
        assert _matches(backend, compiled, text), text
    for text in case["no_match"]:
        assert not re.fullmatch(case["pattern"], text)
        assert not _matches(backend, compiled, text), text


@pytest.mark.parametrize("case", REGEXES, ids=[c["name"] for c in REGEXES])
def test_regex_random_walks_fullmatch(backend, tokenizer, case):
    compiled = backend.compile("regex", case["pattern"])
    for seed in SEEDS:
        walk = random_walk(backend, backend.new_state(compiled), seed,
                           tokenizer=tokenizer if seed % 2 else None)
        assert walk.terminated
        text = walk.text(backend)
        assert re.fullmatch(case["pattern"], text), text


# ---- EBNF grammars ----

@pytest.mark.parametrize("name,grammar", GRAMMARS, ids=[n for n, _ in GRAMMARS])
def test_grammar_examples(backend, name, grammar):
    compiled = backend.compile("ebnf", grammar)
    good, bad = GRAMMAR_EXAMPLES[name]
    for text in good:
        assert grammar_ok(name, text), text
        assert _matches(backend, compiled, text), text
    for text in bad:
        assert not grammar_ok(name, text), text
        assert not _matches(backend, compiled, text), text


@pytest.mark.parametrize("name,grammar", GRAMMARS, ids=[n for n, _ in GRAMMARS])
def test_grammar_random_walks_parse(backend, tokenizer, name, grammar):
    compiled = backend.compile("ebnf", grammar)
    for seed in (0, 1, 2):
        walk = random_walk(backend, backend.new_state(compiled), seed,
                           tokenizer=tokenizer if seed % 2 else None)
        assert walk.terminated
        text = walk.text(backend)
        assert grammar_ok(name, text), text
