"""Grammar rewrites that keep outputs valid UTF-8 and valid JSON."""

from __future__ import annotations

import json

import pytest

from radixflow.runtime.constrained.xgrammar_compat import fix_printed_grammar, fix_regex

SURROGATE = b"\xed\xbf\xaf"  # the 3-byte form of U+DFEF: not valid UTF-8


@pytest.mark.parametrize("pattern,expected", [
    ("[^a]", r"[^\ud800-\udfffa]"),
    ("[^]a]", r"[^\ud800-\udfff\]a]"),
    ("[]a]", r"[\]a]"),
    (r"\[^x", r"\[^x"),
    ("a.b", r"a[^\n\r\u2028\u2029\ud800-\udfff]b"),
    ("[.]", "[.]"),
])
def test_fix_regex(pattern, expected):
    assert fix_regex(pattern) == expected


def test_fix_printed_grammar_skips_string_literals():
    text = 'root ::= "[^a]" [^b] Regex("[^@]+", json_string=true) [\\0-\\U0010ffff]'
    fixed = fix_printed_grammar(text)
    assert '"[^a]"' in fixed
    assert "[^\\ud800-\\udfffb]" in fixed
    assert 'Regex("[^\\\\ud800-\\\\udfff@]+", json_string=true)' in fixed
    assert fixed.endswith("[^\\ud800-\\udfff]")


def _accepts(backend, kind, spec, data: bytes) -> bool:
    state = backend.new_state(backend.compile(kind, spec))
    return state.matcher.accept_string(data) and state.can_terminate()


@pytest.mark.parametrize("kind,spec,wrap", [
    ("regex", "[^a]{1,3}", b"%s"),
    ("regex", "x.", b"x%s"),
    ("ebnf", "root ::= [^a]+", b"%s"),
    ("json_schema", json.dumps({"type": "string"}), b'"%s"'),
    ("json_schema", json.dumps({"type": "string", "maxLength": 3}), b'"%s"'),
    ("json_schema", json.dumps({"type": "string", "pattern": "^[^@]+$"}), b'"%s"'),
    ("json_object", "", b'{"%s": 1}'),
])
def test_no_surrogates_but_emoji_ok(backend, kind, spec, wrap):
    assert not _accepts(backend, kind, spec, wrap % SURROGATE)
    assert _accepts(backend, kind, spec, wrap % "😀".encode())


def test_bounded_json_strings_reject_raw_control_characters(backend):
    schema = json.dumps({"type": "string", "minLength": 1, "maxLength": 5})
    assert not _accepts(backend, "json_schema", schema, b'"a\tb"')
    assert _accepts(backend, "json_schema", schema, b'"a b"')
