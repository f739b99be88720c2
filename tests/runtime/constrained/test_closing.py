"""Budget-safe closing, without a model: a looping adversary decodes every grammar of the corpus
under random budgets, following the scheduler's protocol (closing.py), and every output whose
budget fits the grammar's first completion is complete and valid, within its budget."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

import pytest
import xgrammar as xgr
from helpers.constraint_corpus import load_grammars, load_regexes, load_schemas
from helpers.constraint_validators import grammar_ok, schema_errors
from helpers.grammar_walk import allowed_ids

from radixflow.runtime.constrained.alphabet import byte_alphabet
from radixflow.runtime.constrained.completion import greedy_completion, shortest_completion

SCHEMAS = load_schemas()
REGEXES = load_regexes()
GRAMMARS = load_grammars()
SEEDS = (0, 1, 2)


@dataclass
class Run:
    budget: int
    feasible: bool
    output_ids: list[int] = field(default_factory=list)
    closed: bool = False
    terminated: bool = False

    def text(self, backend, errors: str = "strict") -> str:
        ids = [t for t in self.output_ids if t not in backend.stop_token_ids]
        return backend.table.bytes_of(ids).decode("utf-8", errors=errors)


def _pick(rng: random.Random, allowed: list[int], previous: int | None, stops: set[int]) -> int:
    """A small model's worst habits: repeat the last token, else anything; stop only rarely."""
    text = [t for t in allowed if t not in stops]
    if not text:
        return next(t for t in allowed if t in stops)
    if previous in text and rng.random() < 0.6:
        return previous
    if any(t in stops for t in allowed) and rng.random() < 0.03:
        return next(t for t in allowed if t in stops)
    return rng.choice(text)


def adversary_run(backend, compiled, budget: int, seed: int, *, jump_tokenizer=None) -> Run:
    """Decode with the scheduler's protocol: check each sampled token with the closer (keep or
    close), take jump-forwards only when the closer allows them."""
    rng = random.Random(seed)
    state = backend.new_state(compiled, budget_safe=True)
    closer, matcher = state.closer, state.matcher
    run = Run(budget, closer.start(matcher, budget))
    stops, table = set(backend.stop_token_ids), backend.table
    bitmask = backend.allocate_bitmask(1)
    while len(run.output_ids) < budget and not state.is_terminated():
        left = budget - len(run.output_ids)
        if jump_tokenizer is not None and _jump(state, run, jump_tokenizer, table, left):
            continue
        bitmask.fill_(-1)
        backend.fill_bitmasks([state], bitmask)
        token = _pick(rng, allowed_ids(bitmask[0], backend.vocab_size),
                      run.output_ids[-1] if run.output_ids else None, stops)
        if run.feasible and token not in stops:
            assert matcher.accept_token(token)
            keep = closer.keep(matcher, table.token_bytes[token], left - 1)
            matcher.rollback(1)
            if closer.tokens is not None:  # the tokens it carries along spell the witness
                assert table.bytes_of(closer.tokens) == closer.witness
            if not keep:
                tokens = closer.closing_tokens(matcher)
                assert tokens is not None
                for t in [*tokens, backend.stop_token_ids[0]]:
                    assert state.accept_token(t)
                    run.output_ids.append(t)
                run.closed = True
                break
        assert state.accept_token(token)
        run.output_ids.append(token)
    run.terminated = state.is_terminated()
    return run


def _jump(state, run: Run, tokenizer, table, left: int) -> bool:
    jump = state.jump_forward(tokenizer, run.output_ids, max_new_tokens=left)
    if jump is None:
        return False
    replaced = run.output_ids[len(run.output_ids) - jump.num_replaced:]
    grown = table.bytes_of(jump.token_ids)[len(table.bytes_of(replaced)):]
    if run.feasible and not state.closer.after_jump(
            grown, left - (len(jump.token_ids) - jump.num_replaced)):
        return False
    state.apply_jump_forward(jump)
    run.output_ids[len(run.output_ids) - jump.num_replaced:] = jump.token_ids
    return True


def first_completion_tokens(backend, compiled) -> int:
    """Tokens of the completion a fresh request starts from (its budget must fit them + EOS)."""
    state = backend.new_state(compiled, budget_safe=True)
    assert state.closer.start(state.matcher, 1 << 20)
    return len(state.closer.encode(state.closer.witness))


def budgets(backend, compiled, seed: int) -> list[int]:
    rng = random.Random(seed)
    first = first_completion_tokens(backend, compiled)
    return [max(1, first + 1 + rng.randint(-3, 40)) for _ in range(2)]


def check_runs(backend, compiled, seed: int, valid, tokenizer, errors: str = "strict") -> None:
    for k, budget in enumerate(budgets(backend, compiled, seed)):
        run = adversary_run(backend, compiled, budget, seed * 7 + k,
                            jump_tokenizer=tokenizer if seed % 2 else None)
        assert len(run.output_ids) <= budget
        if run.feasible:
            assert run.terminated, (budget, run.text(backend, errors))
            valid(run.text(backend, errors))
        else:
            assert budget < first_completion_tokens(backend, compiled) + 1


# ---- the corpus under random budgets ----

@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_schema_outputs_close_within_budget(backend, tokenizer, name, schema):
    compiled = backend.compile("json_schema", json.dumps(schema))

    def valid(text: str) -> None:
        assert schema_errors(schema, json.loads(text)) == [], text

    for seed in SEEDS:
        check_runs(backend, compiled, seed, valid, tokenizer)


@pytest.mark.parametrize("case", REGEXES, ids=[c["name"] for c in REGEXES])
def test_regex_outputs_close_within_budget(backend, tokenizer, case):
    compiled = backend.compile("regex", case["pattern"])

    def valid(text: str) -> None:
        assert re.fullmatch(case["pattern"], text), text

    for seed in SEEDS:
        check_runs(backend, compiled, seed, valid, tokenizer)


@pytest.mark.parametrize("name,grammar", GRAMMARS, ids=[n for n, _ in GRAMMARS])
def test_ebnf_outputs_close_within_budget(backend, tokenizer, name, grammar):
    compiled = backend.compile("ebnf", grammar)

    def valid(text: str) -> None:
        assert grammar_ok(name, text), text

    for seed in SEEDS:
        check_runs(backend, compiled, seed, valid, tokenizer)


ARGS = {"type": "object", "properties": {"x": {"type": "integer"}, "why": {"type": "string"}},
        "required": ["x", "why"], "additionalProperties": False}
CALL = {"type": "tag", "begin": "<call>f ", "end": "</call>",
        "content": {"type": "json_schema", "json_schema": ARGS}}
TAGS = {  # tool calls: optional (triggered by "<call>"), and required (the call is the output)
    "triggered": {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<call>"], "tags": [CALL]}},
    "required": {"type": "structural_tag", "format": CALL},
}


@pytest.mark.parametrize("name", list(TAGS))
def test_tool_call_arguments_close_within_budget(backend, tokenizer, name):
    compiled = backend.compile("structural_tag", json.dumps(TAGS[name]))

    def valid(text: str) -> None:
        calls = re.findall(r"<call>f (.*?)</call>", text, flags=re.S)
        assert text.count("<call>") == len(calls), text
        assert name == "triggered" or calls, text
        for args in calls:
            assert schema_errors(ARGS, json.loads(args)) == [], text

    for seed in (*SEEDS, 3, 4, 5):
        # NOTE: xgrammar lets a tag's free text hold any bytes, whole UTF-8 or not
        check_runs(backend, compiled, seed, valid, tokenizer, errors="replace")


def test_the_adversary_needs_closing(backend, tokenizer):
    """Without the closer the same adversary runs out of budget mid-structure: the tests above
    exercise closing, not luck."""
    closed = 0
    for _name, schema in SCHEMAS[:20]:
        compiled = backend.compile("json_schema", json.dumps(schema))
        for seed in SEEDS:
            budget = budgets(backend, compiled, seed)[0]
            closed += adversary_run(backend, compiled, budget, seed).closed
    assert closed >= 20


# ---- completions ----

INFO = xgr.TokenizerInfo([chr(c) for c in range(32, 127)])
SEPARATORS = {"any_whitespace": False, "separators": (", ", ": "), "strict_mode": True}
PROFILE = {"type": "object",
           "properties": {"name": {"type": "string", "maxLength": 32},
                          "age": {"type": "integer", "minimum": 0, "maximum": 150},
                          "hobbies": {"type": "array", "items": {"type": "string"}}},
           "required": ["name", "age", "hobbies"], "additionalProperties": False}
CASES = [
    (xgr.Grammar.from_json_schema(json.dumps(PROFILE), **SEPARATORS), '{"name": "Bo',
     b'", "age": 0, "hobbies": []}'),
    (xgr.Grammar.from_json_schema(json.dumps(PROFILE), **SEPARATORS), '{"name": "B", "age": 12',
     b', "hobbies": []}'),
    (xgr.Grammar.from_json_schema(json.dumps({"type": "string", "minLength": 3}),
                                  **SEPARATORS), '"', b'AAA"'),
    (xgr.Grammar.from_json_schema(json.dumps({"type": "array", "minItems": 2,
                                              "items": {"type": "integer"}}), **SEPARATORS),
     "[12", b", 0]"),
    (xgr.Grammar.from_regex(r"\d{4}-\d{2}-\d{2}"), "20", b"00-00-00"),
    (xgr.Grammar.from_regex(r"[a-z]+@[a-z]+\.(com|org)"), "abc", b"@a.com"),
    (xgr.Grammar.from_ebnf('root ::= "a" root "b" | "c"'), "aaa", b"cbbb"),
    (xgr.Grammar.from_ebnf('root ::= "x" ("yy" | "z")* "w"'), "xyyz", b"w"),
]


@pytest.mark.parametrize("grammar,prefix,expected", CASES,
                         ids=[f"{i}:{c[1]}" for i, c in enumerate(CASES)])
def test_shortest_completion(grammar, prefix, expected):
    compiled = xgr.GrammarCompiler(INFO).compile_grammar(grammar)
    alphabet = byte_alphabet(compiled.grammar)
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_string(prefix)
    before = matcher._debug_print_internal_state()
    found = shortest_completion(matcher, alphabet)
    assert len(found) == len(expected), found
    greedy = greedy_completion(matcher, alphabet, 256)
    assert len(greedy) >= len(found)
    assert matcher._debug_print_internal_state() == before  # untouched
    for text in (found, greedy):
        probe = matcher.fork()
        assert probe.accept_string(text) and probe.is_completed()


def test_alphabet_falls_back_to_printable_ascii():
    class Opaque:
        def serialize_json(self) -> str:
            return "{}"

    alphabet = byte_alphabet(Opaque())
    assert len(alphabet.reps) == 97 and b'"' in alphabet.reps


def test_closing_tokens_round_trip(backend):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    state = backend.new_state(backend.compile("json_schema", json.dumps(schema)),
                              budget_safe=True)
    assert state.matcher.accept_string('{"a": "x')
    assert state.closer.start(state.matcher, 50)
    tokens = state.closer.closing_tokens(state.matcher)
    assert backend.table.bytes_of(tokens) == b'"}'
    assert not state.closer.start(state.matcher, 1)  # '"}' + EOS needs more than one token
