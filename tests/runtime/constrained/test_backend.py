"""GrammarBackend and GrammarState: compile cache, bitmask fill/apply, EOS handling, rollback,
special and padding tokens."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.grammar_walk import allowed_ids

from radixflow.kernels.bitmask import apply_bitmask_
from radixflow.runtime.constrained import GrammarBackend
from radixflow.runtime.errors import GrammarError

PERSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                      "age": {"type": "integer"}},
                     "required": ["name", "age"]})


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _feed(state, token_ids: list[int]) -> None:
    for token_id in token_ids:
        assert state.accept_token(token_id), token_id


def _mask(backend, state) -> list[int]:
    bitmask = backend.allocate_bitmask(1)
    backend.fill_bitmasks([state], bitmask)
    return allowed_ids(bitmask[0], backend.vocab_size)


@pytest.fixture()
def fresh(tokenizer):
    backend = GrammarBackend(tokenizer, 544)
    yield backend
    backend.shutdown()


def test_cache_hit_costs_no_compile(fresh):
    first = fresh.compile("json_schema", PERSON)
    assert fresh.num_compiles == 1
    assert fresh.compile("json_schema", PERSON) is first
    assert fresh.num_compiles == 1
    fresh.compile("regex", r"\d+")
    assert fresh.num_compiles == 2


def test_cache_hit_skips_validation(fresh, monkeypatch):
    fresh.compile("json_schema", PERSON)
    calls = []
    monkeypatch.setattr(fresh, "validate", lambda kind, spec: calls.append(kind))
    fresh.compile("json_schema", PERSON)
    assert calls == []
    fresh.compile("regex", "[a-c]")
    assert calls == ["regex"]


def test_compile_errors_are_grammar_errors_and_cached(fresh):
    with pytest.raises(GrammarError, match="cannot compile ebnf.*not defined"):
        fresh.compile("ebnf", 'root ::= "a" missing_rule')
    with pytest.raises(GrammarError, match="not defined"):
        fresh.compile("ebnf", 'root ::= "a" missing_rule')
    assert fresh.num_compiles == 1
    with pytest.raises(GrammarError, match='Unsupported type "strin"'):
        fresh.compile("json_schema", '{"type": "strin"}')


def test_invalid_spec_never_reaches_the_compiler(fresh):
    with pytest.raises(GrammarError, match="lookahead"):
        fresh.compile("regex", "a(?=b)")
    assert fresh.num_compiles == 0


def test_bitmask_shape_and_rows_left_untouched(backend, tokenizer):
    bitmask = backend.allocate_bitmask(3)
    assert bitmask.shape == (3, (544 + 31) // 32) and bitmask.dtype == torch.int32
    bitmask[1].fill_(7)
    state = backend.new_state(backend.compile("regex", "[0-9]+"))
    backend.fill_bitmasks([state, None, state], bitmask)
    assert torch.equal(bitmask[1], torch.full_like(bitmask[1], 7))
    digits = {_ids(tokenizer, str(d))[0] for d in range(10)}
    allowed = set(allowed_ids(bitmask[0], 544))
    assert digits <= allowed
    assert all(tokenizer.decode([t]).isdigit() for t in allowed)
    assert torch.equal(bitmask[0], bitmask[2])


def test_special_and_padding_tokens_are_never_text(backend):
    state = backend.new_state(backend.compile("regex", "[^a]{0,5}"))
    allowed = set(_mask(backend, state))
    assert 2 in allowed  # EOS: the empty string is a complete match
    assert not allowed & {0, 1}  # <|endoftext|>, <|im_start|> are not text
    assert not allowed & set(range(515, 544))  # model padding past the tokenizer


def test_apply_bitmask_only_touches_given_rows(backend):
    state = backend.new_state(backend.compile("choices", json.dumps(["yes", "no"])))
    bitmask = backend.allocate_bitmask(2)
    backend.fill_bitmasks([state, None], bitmask)
    logits = torch.randn(2, 544)
    before = logits.clone()
    apply_bitmask_(logits, bitmask, [0])
    allowed = allowed_ids(bitmask[0], 544)
    assert torch.equal(logits[1], before[1])
    assert torch.isfinite(logits[0, allowed]).all()
    assert torch.isinf(logits[0]).sum() == 544 - len(allowed)
    apply_bitmask_(logits, bitmask, [])
    assert torch.equal(logits[1], before[1])


def test_apply_bitmask_bfloat16(backend):
    state = backend.new_state(backend.compile("regex", "a"))
    bitmask = backend.allocate_bitmask(1)
    backend.fill_bitmasks([state], bitmask)
    logits = torch.zeros(1, 544, dtype=torch.bfloat16)
    apply_bitmask_(logits, bitmask)
    assert torch.isfinite(logits).sum() == 1


def test_fill_async_matches_sync(backend):
    compiled = backend.compile("json_schema", PERSON)
    states = [backend.new_state(compiled), None, backend.new_state(compiled)]
    sync, threaded = backend.allocate_bitmask(3), backend.allocate_bitmask(3)
    backend.fill_bitmasks(states, sync)
    backend.fill_bitmasks_async(states, threaded).result(timeout=30)
    assert torch.equal(sync, threaded)


def test_eos_only_when_the_grammar_accepts(backend, tokenizer):
    state = backend.new_state(backend.compile("regex", r"\d{2}"))
    assert not state.can_terminate()
    assert not state.accept_token(2)  # EOS before the text is complete
    _feed(state, _ids(tokenizer, "4"))
    assert 2 not in _mask(backend, state) and not state.must_stop()
    _feed(state, _ids(tokenizer, "2"))
    assert state.can_terminate() and state.must_stop()
    assert _mask(backend, state) == [2]
    assert not state.is_terminated()
    assert state.accept_token(2)
    assert state.is_terminated()
    assert not state.accept_token(_ids(tokenizer, "1")[0])


def test_must_stop_is_false_while_text_may_continue(backend, tokenizer):
    state = backend.new_state(backend.compile("regex", r"\d+"))
    _feed(state, _ids(tokenizer, "7"))
    assert state.can_terminate() and not state.must_stop()


def test_terminated_state_row_allows_only_eos(backend, tokenizer):
    state = backend.new_state(backend.compile("choices", json.dumps(["ok"])))
    _feed(state, _ids(tokenizer, "ok") + [2])
    assert state.is_terminated()
    assert _mask(backend, state) == [2]


def test_rollback_restores_state(backend, tokenizer):
    state = backend.new_state(backend.compile("json_schema", PERSON))
    prefix = _ids(tokenizer, '{"name": "Al')
    _feed(state, prefix)
    mask_before = _mask(backend, state)
    more = _ids(tokenizer, 'ice", "age": 3')
    _feed(state, more)
    assert _mask(backend, state) != mask_before
    state.rollback(len(more))
    assert state.num_accepted == len(prefix)
    assert _mask(backend, state) == mask_before
    with pytest.raises(ValueError, match="only"):
        state.rollback(len(prefix) + 1)


def test_rollback_undoes_eos(backend, tokenizer):
    state = backend.new_state(backend.compile("choices", json.dumps(["ok", "okay"])))
    _feed(state, _ids(tokenizer, "ok") + [2])
    state.rollback(1)
    assert not state.is_terminated() and state.can_terminate()
    assert len(_mask(backend, state)) > 1  # "okay" is still possible


def test_fork_is_independent(backend, tokenizer):
    state = backend.new_state(backend.compile("choices", json.dumps(["left", "right"])))
    twin = state.fork()
    _feed(state, _ids(tokenizer, "left"))
    assert twin.num_accepted == 0
    _feed(twin, _ids(tokenizer, "right"))
    assert state.can_terminate() and twin.can_terminate()


def test_choices_match_exactly_one(backend, tokenizer):
    choices = ['say "hi"', "a\\b", "naïve ☕", "tab\there", "yes", "yes sir"]
    compiled = backend.compile("choices", json.dumps(choices))
    for choice in choices:
        state = backend.new_state(compiled)
        assert state.matcher.accept_string(choice) and state.can_terminate(), choice
    state = backend.new_state(compiled)
    assert state.matcher.accept_string("yes") and state.can_terminate() and not state.must_stop()
    assert not backend.new_state(compiled).matcher.accept_string("no")


def test_json_object_kind(backend):
    compiled = backend.compile("json_object", "")
    state = backend.new_state(compiled)
    assert state.matcher.accept_string('{"any": [1, {"x": null}]}') and state.can_terminate()
    assert not backend.new_state(compiled).matcher.accept_string("[1]")


def test_regex_dot_excludes_newline_like_python(backend):
    compiled = backend.compile("regex", "a.c")
    assert backend.new_state(compiled).matcher.accept_string("abc")
    assert not backend.new_state(compiled).matcher.accept_string("a\nc")


def test_vocab_size_may_exceed_tokenizer(tokenizer):
    backend = GrammarBackend(tokenizer, 1024)
    try:
        assert backend.allocate_bitmask(1).shape == (1, 32)
        state = backend.new_state(backend.compile("regex", "[a-z]+"))
        allowed = _mask(backend, state)
        assert allowed and max(allowed) < len(tokenizer)
    finally:
        backend.shutdown()


def test_custom_stop_tokens(tokenizer):
    backend = GrammarBackend(tokenizer, 544, stop_token_ids=[0, 2])
    try:
        state = backend.new_state(backend.compile("choices", '["x"]'))
        _feed(state, _ids(tokenizer, "x"))
        assert _mask(backend, state) == [0, 2]
    finally:
        backend.shutdown()


def test_stop_token_in_the_sign_bit(tokenizer):
    from radixflow.runtime.constrained.token_table import int32_bit

    assert int32_bit(31) == -(2**31) and int32_bit(0) == 1
    backend = GrammarBackend(tokenizer, 544, stop_token_ids=[2, 63])
    try:
        state = backend.new_state(backend.compile("choices", '["x"]'))
        _feed(state, _ids(tokenizer, "x") + [63])
        assert state.is_terminated()
        assert _mask(backend, state) == [2, 63]
    finally:
        backend.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_apply_bitmask_on_gpu_matches_cpu(backend):
    state = backend.new_state(backend.compile("json_schema", PERSON))
    bitmask = backend.allocate_bitmask(3)
    backend.fill_bitmasks([state, None, state], bitmask)
    logits = torch.randn(3, 544)
    on_gpu = logits.cuda()
    apply_bitmask_(logits, bitmask, [0, 2])
    apply_bitmask_(on_gpu, bitmask.cuda(), [0, 2])
    assert torch.equal(on_gpu.cpu(), logits)
