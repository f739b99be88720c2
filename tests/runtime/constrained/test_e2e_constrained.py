"""Constrained generation end to end on the default model (SmolLM2-135M-Instruct) through the
in-process Engine: greedy and sampled outputs validate against their JSON Schema / regex /
grammar; stop conditions combine correctly with constraints. Bounded: one engine, batched
requests, small max_new_tokens."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from helpers.constraint_corpus import load_grammars, load_regexes, load_schemas
from helpers.constraint_validators import grammar_ok, schema_errors
from helpers.engine_checks import jump_forward

from radixflow.runtime.errors import GrammarError, InvalidRequest

try:
    from radixflow.runtime.engine import Engine
except ImportError:  # the engine is not there yet
    pytest.skip("radixflow.runtime.engine.Engine is not importable", allow_module_level=True)

pytestmark = pytest.mark.e2e

SCHEMAS = ["03_enum_color", "07_sentiment", "12_empty_allowed_array", "20_format_datetime",
           "23_format_ipv4", "25_format_uuid", "27_integer_range", "33_geo_point",
           "35_any_of_objects", "39_ref_defs", "45_booleans_and_nulls", "48_tool_call",
           # adversarial: rewritten oneOf, discriminated union, typed enum, untyped keywords
           "63_one_of_enum_overlap", "67_one_of_discriminated_refs", "85_enum_typed",
           "87_untyped_string_number_keywords"]
REGEXES = ["iso_date", "time_24h", "us_phone", "email", "ipv4", "integer", "float",
           "identifier", "hex_color", "uuid", "yes_no", "anchored_named_groups"]
GRAMMARS = ["arithmetic", "sql_select", "function_call", "multiple_choice"]
MAX_NEW_TOKENS = 96


@pytest.fixture(scope="module")
def engine():
    with Engine(None, max_total_tokens=16384) as engine:
        yield engine


def _chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def _greedy_and_sampled(constraint: dict) -> list[dict]:
    base = {"max_new_tokens": MAX_NEW_TOKENS, **constraint}
    return [{**base, "temperature": 0.0}, {**base, "temperature": 0.9, "seed": 7}]


def _run(engine, prompts: list[str], params: list[dict]) -> list[dict]:
    return engine.generate(prompts, params)


def _prefix_ok(engine, kind: str, spec: str, text: str) -> bool:
    backend = engine.scheduler.grammars.backend
    state = backend.new_state(backend.compile(kind, spec))
    return state.matcher.accept_string(text)


def _check(engine, outputs: list[dict], kinds_specs: list[tuple[str, str]], validate) -> None:
    eos_ids = set(engine.scheduler.eos_ids)
    stopped = 0
    for out, (kind, spec) in zip(outputs, kinds_specs, strict=True):
        finish = out["meta_info"]["finish_reason"]
        if finish["type"] == "stop":
            stopped += 1
            assert finish["matched"] in eos_ids, finish  # EOS only once the grammar accepts
            assert validate(spec, out["text"]), (spec, out["text"])
        else:  # cut by max_new_tokens: still a valid prefix
            assert finish["type"] == "length", finish
            assert _prefix_ok(engine, kind, spec, out["text"]), out["text"]
    assert stopped >= 0.75 * len(outputs), [o["text"] for o in outputs]


def test_json_schemas_greedy_and_sampled(engine):
    corpus = dict(load_schemas())
    prompts, params, specs = [], [], []
    for name in SCHEMAS:
        schema = corpus[name]
        spec = json.dumps(schema)
        for p in _greedy_and_sampled({"json_schema": spec}):
            prompts.append(_chat(engine, f"{schema['description']} Reply with JSON only."))
            params.append(p)
            specs.append(("json_schema", spec))

    def valid(spec: str, text: str) -> bool:
        return schema_errors(json.loads(spec), json.loads(text)) == []

    _check(engine, _run(engine, prompts, params), specs, valid)


def test_regexes_greedy_and_sampled(engine):
    cases = {c["name"]: c for c in load_regexes()}
    prompts, params, specs = [], [], []
    for name in REGEXES:
        case = cases[name]
        for p in _greedy_and_sampled({"regex": case["pattern"], "max_new_tokens": 48}):
            prompts.append(_chat(engine, f"Write {case['description'].lower()}"))
            params.append(p)
            specs.append(("regex", case["pattern"]))
    _check(engine, _run(engine, prompts, params), specs,
           lambda spec, text: re.fullmatch(spec, text) is not None)


def test_ebnf_grammars_greedy_and_sampled(engine):
    grammars = dict(load_grammars())
    prompts, params, specs, names = [], [], [], []
    for name in GRAMMARS:
        grammar = grammars[name]
        description = grammar.splitlines()[0].lstrip("# ")
        for p in _greedy_and_sampled({"ebnf": grammar}):
            prompts.append(_chat(engine, f"Write {description}"))
            params.append(p)
            specs.append(("ebnf", grammar))
            names.append(name)
    outputs = _run(engine, prompts, params)
    by_spec = dict(zip((g for _, g in specs), names))
    _check(engine, outputs, specs, lambda spec, text: grammar_ok(by_spec[spec], text))


def test_choices(engine):
    choices = ["positive", "negative", "neutral"]
    prompt = _chat(engine, "Sentiment of 'What a wonderful day!'?")
    outputs = _run(engine, [prompt, prompt],
                   _greedy_and_sampled({"choices": choices, "max_new_tokens": 8}))
    for out in outputs:
        assert out["text"] in choices
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_max_tokens_mid_json_is_length(engine):
    schema = json.dumps(dict(load_schemas())["48_tool_call"])
    out = engine.generate(_chat(engine, "Call a tool."),
                          {"json_schema": schema, "max_new_tokens": 6, "temperature": 0})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert _prefix_ok(engine, "json_schema", schema, out["text"])
    with pytest.raises(ValueError):
        json.loads(out["text"])


def test_unconstrained_neighbours_are_unaffected(engine):
    plain = _chat(engine, "Name a colour.")
    params = {"max_new_tokens": 12, "temperature": 0}
    alone = engine.generate(plain, params)["text"]
    mixed = _run(engine, [plain, _chat(engine, "A date?")],
                 [params, {**params, "regex": r"\d{4}-\d{2}-\d{2}"}])
    assert mixed[0]["text"] == alone
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", mixed[1]["text"])


def test_bad_constraint_is_rejected_and_engine_keeps_serving(engine):
    prompt = _chat(engine, "Hi")
    with pytest.raises(GrammarError, match="lookahead"):  # checked before the scheduler
        engine.generate(prompt, {"regex": "a(?=b)", "max_new_tokens": 4})
    with pytest.raises(InvalidRequest, match="is not defined"):  # refused by the compiler
        engine.generate(prompt, {"ebnf": "root ::= nowhere", "max_new_tokens": 4})
    out = engine.generate(prompt, {"regex": "(yes|no)", "max_new_tokens": 4, "temperature": 0})
    assert out["text"] in ("yes", "no")


def test_jump_forward_on_and_off(engine):
    """Same validity either way; fewer forward passes with jump-forward; bitmasks are filled
    (off the critical path) for every sampled constrained token."""
    corpus = dict(load_schemas())
    names = ["33_geo_point", "39_ref_defs", "48_tool_call"]
    prompts = [_chat(engine, f"{corpus[n]['description']} Reply with JSON only.") for n in names]
    params = [{"json_schema": json.dumps(corpus[n]), "max_new_tokens": MAX_NEW_TOKENS,
               "temperature": 0} for n in names]
    specs = [("json_schema", p["json_schema"]) for p in params]
    scheduler, stats = engine.scheduler, engine.scheduler.grammars.stats

    def valid(spec: str, text: str) -> bool:
        return schema_errors(json.loads(spec), json.loads(text)) == []

    passes = {}
    for enabled in (False, True):
        before, masked = scheduler.num_forward_passes, stats.num_masked_rows
        with jump_forward(engine, enabled):
            outputs = _run(engine, prompts, params)
        passes[enabled] = scheduler.num_forward_passes - before
        _check(engine, outputs, specs, valid)
        sampled = sum(len(o["output_ids"]) for o in outputs)
        if enabled:
            assert stats.num_masked_rows - masked < sampled  # forced tokens need no mask
        else:
            assert stats.num_masked_rows - masked == sampled
    assert stats.num_jumps > 0 and stats.mask_fill_s > 0
    assert passes[True] < passes[False]


def test_a_slow_compile_does_not_block_an_unconstrained_request(engine):
    cache = engine.scheduler.grammars.backend._cache
    real, release, result = cache._compile_fn, threading.Event(), {}

    def slow(key):
        release.wait(timeout=60)
        return real(key)

    schema = json.dumps({"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"], "title": "never compiled before"})
    cache._compile_fn = slow
    try:
        thread = threading.Thread(target=lambda: result.update(out=engine.generate(
            _chat(engine, "Where is the Eiffel tower? JSON."),
            {"json_schema": schema, "max_new_tokens": 32, "temperature": 0})))
        thread.start()
        for _ in range(500):
            if any(r.pending_grammar is not None for r in engine.scheduler.waiting):
                break
            time.sleep(0.01)
        free = engine.generate(_chat(engine, "Say hi."), {"max_new_tokens": 4, "temperature": 0})
        assert free["meta_info"]["finish_reason"] is not None
        assert thread.is_alive() and "out" not in result  # still compiling
    finally:
        cache._compile_fn = real
        release.set()
        thread.join(timeout=60)
    assert result["out"]["meta_info"]["finish_reason"]["type"] in ("stop", "length")
