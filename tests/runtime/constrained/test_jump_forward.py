"""Jump-forward: forced text is appended as tokens, the boundary is retokenized, and the
output bytes only ever grow by the forced text."""

from __future__ import annotations

import json

from radixflow.runtime.constrained.jump_forward import JumpForward

PERSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                      "age": {"type": "integer"}},
                     "required": ["name", "age"]})


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _apply(state, output_ids: list[int], jump: JumpForward) -> list[int]:
    state.apply_jump_forward(jump)
    return output_ids[:len(output_ids) - jump.num_replaced] + jump.token_ids


def test_forced_json_key_at_the_start(backend, tokenizer):
    state = backend.new_state(backend.compile("json_schema", PERSON))
    jump = state.jump_forward(tokenizer, [])
    assert jump is not None and jump.num_replaced == 0
    assert jump.text.startswith('{"name":')
    assert backend.table.bytes_of(jump.token_ids).decode() == jump.text
    output = _apply(state, [], jump)
    assert state.num_accepted == len(output)
    assert state.jump_forward(tokenizer, output) is None  # the name itself is free text


def test_boundary_is_retokenized(backend, tokenizer):
    """The model wrote the closing quote alone; `",` is one token, so it is replaced."""
    state = backend.new_state(backend.compile("json_schema", PERSON))
    output = _apply(state, [], state.jump_forward(tokenizer, []))
    for piece in ("B", "o", "b", '"'):
        (token,) = _ids(tokenizer, piece)
        assert state.accept_token(token)
        output.append(token)
    jump = state.jump_forward(tokenizer, output)
    assert jump.text == ', "age":'
    assert jump.num_replaced == 1
    assert jump.token_ids[0] == _ids(tokenizer, '",')[0]
    text_before = backend.table.bytes_of(output).decode()
    output = _apply(state, output, jump)
    assert backend.table.bytes_of(output).decode() == text_before + jump.text
    # the forced ' ' is left to the model: it may merge with the digits, as ' 3' does
    assert state.matcher.find_jump_forward_string() == " "
    assert state.jump_forward(tokenizer, output) is None
    assert state.accept_token(_ids(tokenizer, " 3")[0])


def test_trailing_token_that_could_merge_is_left_to_the_model(backend, tokenizer):
    state = backend.new_state(backend.compile("regex", r"ab \d"))
    jump = state.jump_forward(tokenizer, [])
    assert jump.text == "ab"  # ' ' could join the digit, as in ' 3'


def test_no_jump_without_forced_text(backend, tokenizer):
    state = backend.new_state(backend.compile("choices", json.dumps(["alpha", "beta"])))
    assert state.jump_forward(tokenizer, []) is None
    output = [_ids(tokenizer, "a")[0]]
    assert state.accept_token(output[0])
    jump = state.jump_forward(tokenizer, output)
    assert jump is not None and "lpha".startswith(jump.text)


def test_max_new_tokens_caps_growth(backend, tokenizer):
    state = backend.new_state(backend.compile("json_schema", PERSON))
    full = state.jump_forward(tokenizer, [])
    capped = state.jump_forward(tokenizer, [], max_new_tokens=1)
    assert len(full.token_ids) > 1 and len(capped.token_ids) == 1
    assert full.text.startswith(capped.text)
    assert state.jump_forward(tokenizer, [], max_new_tokens=0) is None


def test_terminated_state_has_no_jump(backend, tokenizer):
    state = backend.new_state(backend.compile("choices", '["ok"]'))
    for token in _ids(tokenizer, "ok") + [2]:
        assert state.accept_token(token)
    assert state.jump_forward(tokenizer, []) is None
