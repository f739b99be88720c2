"""Budget-safe structured output on a tiny random model (it loops a lot: a good adversary):
every constrained output whose budget fits the grammar's first completion ends complete and
valid, within max_new_tokens, saying closed_early when the closing ended it; the switches
(request, server) turn it off; max_repeat_run keeps runs short; the KV invariant holds."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
from helpers.constraint_corpus import load_grammars, load_regexes, load_schemas
from helpers.constraint_validators import grammar_ok, schema_errors
from helpers.engine_checks import grammar_flag, settle

from radixflow.runtime.engine import Engine
from radixflow.runtime.response_builder import LOGPROB_FLOOR

SCHEMAS = load_schemas()[::4]  # every schema runs model-free in tests/runtime/constrained
REGEXES = load_regexes()[::3]
GRAMMARS = load_grammars()
PROMPTS = ["The quick brown fox", "Please answer in JSON:", "Numbers: 0 1 2", "a b c"]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=6000,
                max_running_requests=16) as eng:
        yield eng


def server_budget_safe(engine, enabled: bool):
    """Requests compiled inside get (or not) the server's budget-safe closing."""
    return grammar_flag(engine, "budget_safe", enabled)


def feasible(engine, kind: str, spec: str, budget: int) -> bool:
    """What the scheduler decides at a request's start: the first completion fits."""
    backend = engine.scheduler.grammars.backend
    state = backend.new_state(backend.compile(kind, spec), budget_safe=True)
    return state.closer.start(state.matcher, budget)


def first_tokens(engine, kind: str, spec: str) -> int:
    backend = engine.scheduler.grammars.backend
    state = backend.new_state(backend.compile(kind, spec), budget_safe=True)
    assert state.closer.start(state.matcher, 1 << 20)
    return len(state.closer.encode(state.closer.witness))


def run_cases(engine, kind: str, spec: str, valid, seed: int, **extra) -> list[dict]:
    """Greedy and sampled outputs under random budgets around the first completion's size;
    checks each and returns them."""
    rng = random.Random(seed)
    first = first_tokens(engine, kind, spec)
    cases = [(max(1, first + 1 + rng.randint(-2, 24)), temp)
             for temp in (0.0, 1.0, 1.5) for _ in range(2)]
    params = [{kind: spec, "max_new_tokens": budget, "temperature": temp, "seed": seed + i,
               **extra} for i, (budget, temp) in enumerate(cases)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    outputs = engine.generate(prompts, params)
    for out, (budget, _) in zip(outputs, cases):
        meta = out["meta_info"]
        assert meta["completion_tokens"] <= budget
        if feasible(engine, kind, spec, budget):
            assert meta["finish_reason"]["type"] == "stop", (budget, out["text"])
            valid(out["text"])
        if meta.get("closed_early"):
            assert meta["finish_reason"]["type"] == "stop"
            assert meta["finish_reason"]["matched"] in engine.scheduler.eos_ids
    settle(engine)
    return outputs


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_schemas_close_within_budget(engine, name, schema):
    def valid(text: str) -> None:
        assert schema_errors(schema, json.loads(text)) == [], text

    run_cases(engine, "json_schema", json.dumps(schema), valid, seed=len(name))


@pytest.mark.parametrize("case", REGEXES, ids=[c["name"] for c in REGEXES])
def test_regexes_close_within_budget(engine, case):
    def valid(text: str) -> None:
        assert re.fullmatch(case["pattern"], text), text

    run_cases(engine, "regex", case["pattern"], valid, seed=len(case["name"]))


@pytest.mark.parametrize("name,grammar", GRAMMARS, ids=[n for n, _ in GRAMMARS])
def test_ebnf_close_within_budget(engine, name, grammar):
    def valid(text: str) -> None:
        assert grammar_ok(name, text), text

    run_cases(engine, "ebnf", grammar, valid, seed=len(name))


LOOPY = {"type": "object",
         "properties": {"id": {"type": "string"}, "n": {"type": "integer"},
                        "tags": {"type": "array", "items": {"type": "string"}}},
         "required": ["id", "n", "tags"], "additionalProperties": False}


def _loopy_params(n: int, **extra) -> list[dict]:
    return [{"json_schema": json.dumps(LOOPY), "max_new_tokens": 40, "temperature": 1.5,
             "seed": i, **extra} for i in range(n)]


def test_closed_early_is_reported_and_switches_turn_it_off(engine):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    stats = engine.scheduler.grammars.stats
    before = stats.num_closed_early
    safe = engine.generate(prompts, _loopy_params(8))
    closed = [o for o in safe if o["meta_info"].get("closed_early")]
    assert closed and stats.num_closed_early - before == len(closed)
    for out in safe:
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        assert schema_errors(LOOPY, json.loads(out["text"])) == []
    off = engine.generate(prompts, _loopy_params(8, budget_safe=False))
    with server_budget_safe(engine, False):
        server_off = engine.generate(prompts, _loopy_params(8))
    for outputs in (off, server_off):
        assert not any(o["meta_info"].get("closed_early") for o in outputs)
        assert any(o["meta_info"]["finish_reason"]["type"] == "length" for o in outputs)
    settle(engine)


def test_streaming_and_logprobs_of_a_closed_output(engine):
    params = _loopy_params(8)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    outputs = engine.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
    closed = [o for o in outputs if o["meta_info"].get("closed_early")]
    assert closed
    for out in closed:
        meta = out["meta_info"]
        assert meta["output_token_logprobs_length"] == meta["completion_tokens"]
        assert meta["output_token_logprobs"][-1][0] == LOGPROB_FLOOR  # the EOS: not sampled
        assert meta["output_top_logprobs"][-1] == []
    k = outputs.index(closed[0])
    events = list(engine.generate(prompts[k], params[k], stream=True))
    assert events[-1]["meta_info"].get("closed_early") is True
    assert not any(e["meta_info"].get("closed_early") for e in events[:-1])
    assert events[-1]["text"] == engine.generate(prompts[k], params[k])["text"]
    settle(engine)


def _longest_run(text: str) -> int:
    return max((len(list(g)) for c, g in itertools.groupby(text) if c not in "{}[]()"),
               default=0)


def test_max_repeat_run_bounds_runs(engine):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(12)]
    params = [{"regex": r"[0-9a]{1,40}", "max_new_tokens": 24, "temperature": 1.0, "seed": i}
              for i in range(12)]
    free = engine.generate(prompts, params)
    guarded = engine.generate(prompts, [{**p, "max_repeat_run": 2} for p in params])
    assert max(_longest_run(o["text"]) for o in free) > 2
    assert max(_longest_run(o["text"]) for o in guarded) <= 2
    # A literal the grammar fixes is written whole: the guard steps aside.
    forced = engine.generate("a b", {"regex": "x{6}", "max_repeat_run": 2,
                                     "max_new_tokens": 16})
    assert forced["text"] == "xxxxxx"
    settle(engine)


def test_budget_too_small_for_any_completion_runs_as_before(engine):
    spec = json.dumps(LOOPY)
    budget = first_tokens(engine, "json_schema", spec)  # no room for the EOS
    assert not feasible(engine, "json_schema", spec, budget)
    stats = engine.scheduler.grammars.stats
    before = stats.num_budget_unsafe
    out = engine.generate("a b", {"json_schema": spec, "max_new_tokens": budget,
                                  "temperature": 1.5, "seed": 1})
    assert "closed_early" not in out["meta_info"]
    assert stats.num_budget_unsafe == before + 1
    settle(engine)


def test_bad_values_are_refused(engine):
    from radixflow.runtime.errors import InvalidRequest

    for params, name in (({"max_repeat_run": 1}, "max_repeat_run"),
                         ({"max_repeat_run": "3"}, "max_repeat_run"),
                         ({"budget_safe": "yes"}, "budget_safe")):
        with pytest.raises(InvalidRequest, match=name):
            engine.generate("a", {"regex": "a+", **params})



def test_a_thinking_phase_spends_budget_the_closer_recounts(tmp_path_factory):
    """Qwen3 may open <think> beside the grammar's first token: the closer starts on that token
    with the whole budget, the thinking then spends part of it with the grammar dormant, and
    the answer still ends complete within max_new_tokens (the closer starts again from the
    budget left)."""
    from helpers.thinking_model import make_thinking_model, render

    folder = make_thinking_model(tmp_path_factory.mktemp("thinking-budget-safe"))
    with Engine(str(folder), reasoning_parser="qwen3", dtype="float32", max_total_tokens=4000,
                max_running_requests=8) as eng:
        spec = json.dumps(LOOPY)
        start = eng.tokenizer.convert_tokens_to_ids("<think>")
        first = first_tokens(eng, "json_schema", spec)
        thinking = 6
        budget = 1 + thinking + 1 + first + 1 + 4  # <think>, thoughts, </think>, answer, EOS
        params = [{"json_schema": spec, "max_new_tokens": budget, "temperature": 1.5,
                   "seed": i, "thinking_budget": thinking, "logit_bias": {str(start): 100}}
                  for i in range(6)]
        outputs = eng.generate([render(eng.tokenizer, "JSON please.")] * 6, params,
                               separate_reasoning=True)
        for out in outputs:
            meta = out["meta_info"]
            assert out["output_ids"][0] == start and meta["completion_tokens"] <= budget
            assert meta["finish_reason"]["type"] == "stop", out
            assert schema_errors(LOOPY, json.loads(out["text"])) == []
        assert any(o["meta_info"].get("closed_early") for o in outputs)
        # Too little left after the thinking: no promise, and no half-done closing either.
        stats = eng.scheduler.grammars.stats
        unsafe = stats.num_budget_unsafe
        tight = [{**p, "max_new_tokens": budget - 6} for p in params]
        outputs = eng.generate([render(eng.tokenizer, "JSON please.")] * 6, tight,
                               separate_reasoning=True)
        for out in outputs:
            assert out["meta_info"]["completion_tokens"] <= budget - 6
            if out["meta_info"].get("closed_early"):
                assert out["meta_info"]["finish_reason"]["type"] == "stop"
                assert schema_errors(LOOPY, json.loads(out["text"])) == []
        assert stats.num_budget_unsafe > unsafe
        settle(eng)
