"""The scheduler's grammar paths on a tiny random model: background compiles, bitmasks filled
beside the forward, jump-forward (held-back streaming, KV rollback, cut at max_new_tokens),
forced EOS, and the 400s / 500s of failed constraints."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import threading
import time

import jsonschema
import pytest
from helpers.engine_checks import jump_forward, settle

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import GrammarError, InvalidRequest, RadixflowError
from radixflow.runtime.messages import Finish

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "pet": {"enum": ["cat", "dog", "parrot"]},
                         "ok": {"type": "boolean"}},
          "required": ["name", "pet", "ok"], "additionalProperties": False}
PROMPTS = ["The quick brown fox", "Please answer in JSON:", "Once upon a time", "a b c"]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=3000,
                max_running_requests=8) as eng:
        yield eng


@contextlib.contextmanager
def patched_compile(engine, compile_fn):
    cache = engine.scheduler.grammars.backend._cache
    before, cache._compile_fn = cache._compile_fn, compile_fn
    try:
        yield
    finally:
        cache._compile_fn = before


def _schema_params(max_new_tokens=64, **extra) -> dict:
    return {"json_schema": json.dumps(SCHEMA), "max_new_tokens": max_new_tokens,
            "temperature": 0, **extra}


def _prefix_ok(engine, kind: str, spec: str, text: str) -> bool:
    backend = engine.scheduler.grammars.backend
    return backend.new_state(backend.compile(kind, spec)).matcher.accept_string(text)


def _check_schema_outputs(engine, outputs: list[dict]) -> None:
    for out in outputs:
        finish = out["meta_info"]["finish_reason"]
        if finish["type"] == "stop":
            assert finish["matched"] in engine.scheduler.eos_ids
            jsonschema.validate(json.loads(out["text"]), SCHEMA)
        else:
            assert finish["type"] == "length", finish
            assert _prefix_ok(engine, "json_schema", json.dumps(SCHEMA), out["text"])


def _passes(engine, fn):
    before = engine.scheduler.num_forward_passes
    result = fn()
    return result, engine.scheduler.num_forward_passes - before


def test_jump_forward_keeps_outputs_valid_with_fewer_forward_passes(engine):
    def run():
        return engine.generate(PROMPTS, _schema_params())

    with jump_forward(engine, False):
        plain, plain_passes = _passes(engine, run)
    stats = engine.scheduler.grammars.stats
    jumps_before = stats.num_jumps
    with jump_forward(engine, True):
        jumped, jump_passes = _passes(engine, run)
    _check_schema_outputs(engine, plain)
    _check_schema_outputs(engine, jumped)
    assert stats.num_jumps > jumps_before
    assert jump_passes < plain_passes
    settle(engine)


def test_stream_only_appends_and_matches_the_full_output(engine):
    """Held-back tokens are the only ones a jump may rewrite: what was streamed stays."""
    with jump_forward(engine, True):
        full = engine.generate(PROMPTS[1], _schema_params())
        events = list(engine.generate(PROMPTS[1], _schema_params(), stream=True))
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert events[-1]["output_ids"] == full["output_ids"]
    assert texts[-1] == full["text"]
    settle(engine)


def test_fully_forced_output_needs_no_forward(engine):
    params = {"regex": "yes, sir", "max_new_tokens": 16, "temperature": 0}
    with jump_forward(engine, True):
        out, passes = _passes(engine, lambda: engine.generate("Answer:", params))
    assert out["text"] == "yes, sir" and passes == 0
    assert out["meta_info"]["finish_reason"] == {"type": "stop",
                                                 "matched": engine.tokenizer.eos_token_id}
    with jump_forward(engine, False):
        sampled, passes = _passes(engine, lambda: engine.generate("Answer:", params))
    assert sampled["text"] == "yes, sir" and passes > 0
    settle(engine)


def test_a_jump_is_cut_at_max_new_tokens(engine):
    with jump_forward(engine, True):
        out = engine.generate(PROMPTS[0], _schema_params(max_new_tokens=3))
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert len(out["output_ids"]) == 3
    assert _prefix_ok(engine, "json_schema", json.dumps(SCHEMA), out["text"])
    settle(engine)


def test_stops_inside_forced_text(engine):
    with jump_forward(engine, True):
        out = engine.generate("x", {"regex": "abc, then more", "stop": ["then"],
                                    "max_new_tokens": 20, "temperature": 0})
        assert out["text"] == "abc, "
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "then"}
        forced = engine.tokenizer.encode("abc, then more", add_special_tokens=False)
        out = engine.generate("x", {"regex": "abc, then more", "stop_token_ids": [forced[1]],
                                    "max_new_tokens": 20, "temperature": 0})
        assert out["output_ids"][-1] == forced[1]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": forced[1]}
    settle(engine)


def test_mask_work_only_for_constrained_rows(engine):
    stats = engine.scheduler.grammars.stats
    before = stats.num_masked_rows
    engine.generate(PROMPTS, {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
    assert stats.num_masked_rows == before
    alone = engine.generate(PROMPTS[2], {"max_new_tokens": 6, "temperature": 0,
                                         "ignore_eos": True})
    with jump_forward(engine, False):
        mixed = engine.generate(PROMPTS[2:], [
            {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
            {"regex": r"[0-9]{3}", "max_new_tokens": 6, "temperature": 0}])
    assert mixed[0]["output_ids"] == alone["output_ids"]
    assert re.fullmatch(r"[0-9]{3}", mixed[1]["text"])
    assert stats.num_masked_rows == before + len(mixed[1]["output_ids"])  # EOS included
    assert stats.mask_fill_s > 0
    settle(engine)


def test_a_slow_compile_does_not_block_other_requests(engine):
    release = threading.Event()
    result: dict = {}
    real = engine.scheduler.grammars.backend._cache._compile_fn

    def slow(key):
        release.wait(timeout=60)
        return real(key)

    schema = {**SCHEMA, "title": "never seen before"}
    with patched_compile(engine, slow):
        thread = threading.Thread(target=lambda: result.update(out=engine.generate(
            PROMPTS[0], {"json_schema": json.dumps(schema), "max_new_tokens": 64,
                         "temperature": 0})))
        thread.start()
        try:
            for _ in range(500):
                if any(r.pending_grammar is not None for r in engine.scheduler.waiting):
                    break
                time.sleep(0.01)
            free = engine.generate(PROMPTS[1], {"max_new_tokens": 8, "temperature": 0,
                                                "ignore_eos": True})
            assert free["meta_info"]["completion_tokens"] == 8
            assert thread.is_alive() and "out" not in result  # still compiling
        finally:
            release.set()
            thread.join(timeout=60)
    jsonschema.validate(json.loads(result["out"]["text"]), schema)
    settle(engine)


def test_compile_failure_and_timeout_are_400s(engine):
    # Valid to the pre-checks, refused by xgrammar in the scheduler: still a 400.
    with pytest.raises(InvalidRequest, match="is not defined"):
        engine.generate("x", {"ebnf": "root ::= undefined_rule", "max_new_tokens": 4})
    def broken(key):
        raise GrammarError("cannot compile: broken on purpose")

    with patched_compile(engine, broken), pytest.raises(InvalidRequest, match="broken on purpose"):
        engine.generate("x", {"regex": "[a-z]{1,7}q", "max_new_tokens": 4})
    release = threading.Event()
    cache = engine.scheduler.grammars.backend._cache
    timeout, cache.timeout = cache.timeout, 0.2
    try:
        with patched_compile(engine, lambda key: release.wait(timeout=60)):
            with pytest.raises(InvalidRequest, match="longer than"):
                engine.generate("x", {"regex": "[a-z]{1,7}z", "max_new_tokens": 4})
            with pytest.raises(InvalidRequest, match="longer than"):
                list(engine.generate("x", {"regex": "[a-z]{1,7}z", "max_new_tokens": 4},
                                     stream=True))
    finally:
        cache.timeout = timeout
        release.set()
    assert engine.generate("x", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] <= 2
    settle(engine)


@pytest.mark.parametrize("params, match", [
    ({"regex": "a(?=b)"}, "lookahead"),
    ({"json_schema": '{"type": "object", "not": {}}'}, "negation"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"ebnf": "  "}, "ebnf"),
    ({"structural_tag": '{"type": "structural_tag"}'}, "format"),
])
def test_invalid_constraints_never_reach_the_scheduler(engine, params, match):
    compiles = engine.scheduler.grammars.backend.num_compiles
    with pytest.raises(GrammarError, match=match):
        engine.generate("x", {**params, "max_new_tokens": 4})
    assert engine.scheduler.grammars.backend.num_compiles == compiles
    assert not engine.scheduler.by_rid


def test_a_token_the_grammar_rejects_aborts_with_500(engine, monkeypatch):
    free = engine.generate("Answer:", {"max_new_tokens": 1, "temperature": 0})
    letter = next(c for c in "xyzq" if not free["text"].startswith(c))
    monkeypatch.setattr(engine.scheduler.grammars, "wait", lambda job, device: None)  # no mask
    # The Engine raises what an HTTP client gets: a 500.
    with jump_forward(engine, False), pytest.raises(RadixflowError, match="rejected token") as err:
        engine.generate("Answer:", {"regex": letter * 3, "max_new_tokens": 4, "temperature": 0})
    assert err.value.status_code == 500
    settle(engine)


def test_finish_shows_its_status_code():
    assert Finish(type="abort", message="bad", status_code=400).to_json() == {
        "type": "abort", "message": "bad", "status_code": 400}
    assert Finish(type="abort", message="gone").to_json() == {"type": "abort", "message": "gone"}


def test_jumps_survive_retraction(tiny_llama):
    """A pool too small for every request: forced extends retract requests when the pool is
    full, and every output is still valid with no slot lost."""
    schema = {"type": "object", "properties": {
        "words": {"type": "array", "items": {"enum": ["alpha", "beta"]}, "minItems": 12}},
        "required": ["words"], "additionalProperties": False}
    params = {"json_schema": json.dumps(schema), "max_new_tokens": 80, "temperature": 0}
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=300,
                max_running_requests=6) as tight:
        outs = tight.generate([f"Request number {i} says" for i in range(6)], params)
        settle(tight)
        assert tight.scheduler.num_retractions > 0
        assert tight.scheduler.grammars.stats.num_jumps > 0
    for out in outs:
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(out["text"]), schema)


def test_decode_rows_of_one_request_equal_an_extend(tiny_llama):
    """Jump-forward tokens ride in the decode pass as one query row each: their logits equal
    those of extending the same tokens."""
    import torch

    from radixflow.runtime.forward_batch import ForwardMode
    from radixflow.runtime.model_runner import BatchRequest

    engine = Engine(str(tiny_llama), dtype="float32", max_total_tokens=512)
    engine.shutdown()  # drive the runner directly
    runner = engine.scheduler.runner
    prompt = engine.tokenizer.encode("The quick brown fox jumps")
    forced = engine.tokenizer.encode(' over the lazy dog.')
    logits = []
    for decode_rows in (False, True):
        row = runner.req_to_token_pool.alloc()
        slots = runner.kv_pool.alloc(len(prompt) + len(forced))
        runner.req_to_token_pool.req_to_token[row, :len(slots)] = slots.to(torch.int32)
        runner.forward(ForwardMode.EXTEND, [BatchRequest(row, prompt, 0, [])],
                       slots[:len(prompt)])
        rest = slots[len(prompt):]
        if decode_rows:
            parts = [BatchRequest(row, [t], len(prompt) + i, [0])
                     for i, t in enumerate(forced)]
            logits.append(runner.forward(ForwardMode.DECODE, parts, rest))
        else:
            part = BatchRequest(row, forced, len(prompt), list(range(len(forced))))
            logits.append(runner.forward(ForwardMode.EXTEND, [part], rest))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


def test_prebuild_builds_the_backend_on_a_thread_and_passes_on_its_failure(engine, monkeypatch):
    from radixflow.runtime import constrained
    from radixflow.runtime.scheduler.grammar import SchedulerGrammar

    source = engine.scheduler.grammars

    def fresh() -> SchedulerGrammar:
        return SchedulerGrammar(source.tokenizer, source.vocab_size,
                                stop_token_ids=source.stop_token_ids,
                                compile_timeout=source.compile_timeout, jump_forward=True)

    built_on = []
    real = constrained.GrammarBackend

    def recording(*args, **kwargs):
        built_on.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(constrained, "GrammarBackend", recording)
    grammars = fresh()
    grammars.prebuild()
    backend = grammars.backend  # waits for the thread
    assert built_on == ["grammar-backend"] and backend.tokenizer_info is not None
    grammars.prebuild()  # once built, stays
    assert grammars.backend is backend and built_on == ["grammar-backend"]
    grammars.shutdown()

    def broken(*args, **kwargs):
        raise ValueError("no tables for this tokenizer")

    monkeypatch.setattr(constrained, "GrammarBackend", broken)
    grammars = fresh()
    grammars.prebuild()
    with pytest.raises(ValueError, match="no tables"):
        grammars.backend  # noqa: B018 (the property raises what the build raised)
    grammars.shutdown()  # nothing to shut down, no error
