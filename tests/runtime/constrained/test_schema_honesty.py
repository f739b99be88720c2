"""JSON Schema honesty: every keyword is enforced or refused.

- Each schema in tests/data/json_schemas/refused is refused with a GrammarError naming its
  keyword and JSON path; where xgrammar compiles it unchecked, its counterexample shows why:
  xgrammar's own masks accept a text that fails validation.
- The adversarial schemas of the corpus (63 onwards) are walked with more seeds than the rest.
- Where a schema is rewritten (schema_rewrite), xgrammar given the original accepts an invalid
  text that the rewritten grammar rejects; the format patterns agree exactly with jsonschema's
  format checker, and xgrammar matches them as `re` does.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import random
import re

import pytest
import xgrammar as xgr
from helpers.constraint_corpus import load_refused_schemas, load_schemas
from helpers.constraint_validators import FORMAT_CHECKER, schema_errors
from helpers.grammar_walk import random_walk

from radixflow.runtime.constrained import prepare, validate_constraint
from radixflow.runtime.constrained.grammar_build import build_grammar
from radixflow.runtime.constrained.xgrammar_compat import (
    FORMAT_PATTERNS,
    fix_pattern,
    rewrite_schema,
)
from radixflow.runtime.errors import GrammarError

CORPUS = dict(load_schemas())
ADVERSARIAL = [(name, schema) for name, schema in CORPUS.items() if int(name[:2]) >= 63]
REFUSED = load_refused_schemas()


def test_adversarial_corpus_size():
    assert len(ADVERSARIAL) >= 25 and len(REFUSED) >= 25
    for _, case in REFUSED:
        assert case["description"] and case["refused"]["path"].startswith("#")


@pytest.fixture(scope="module")
def raw_compiler(backend):
    return xgr.GrammarCompiler(backend.tokenizer_info, cache_enabled=False)


def _raw_accepts(backend, raw_compiler, schema, text: str) -> bool:
    """Whether xgrammar, given `schema` without our checks and rewrites, accepts `text`."""
    grammar = build_grammar("json_schema", json.dumps(schema))
    matcher = xgr.GrammarMatcher(raw_compiler.compile_grammar(grammar))
    return matcher.accept_string(text) and matcher.accept_token(backend.stop_token_ids[0])


def _accepts(backend, compiled, text: str) -> bool:
    state = backend.new_state(compiled)
    return state.matcher.accept_string(text) and state.can_terminate()


# ---- refused ----

@pytest.mark.parametrize("name,case", REFUSED, ids=[n for n, _ in REFUSED])
def test_refused_names_keyword_and_path(backend, name, case):
    spec = json.dumps(case["schema"])
    where = re.escape(f"'{case['refused']['keyword']}' at {case['refused']['path']}")
    with pytest.raises(GrammarError, match=where) as info:
        validate_constraint("json_schema", spec)
    assert info.value.param == "json_schema"
    with pytest.raises(GrammarError, match=where):
        backend.compile("json_schema", spec)


WITH_COUNTEREXAMPLE = [(n, c) for n, c in REFUSED if "counterexample" in c]


@pytest.mark.parametrize("name,case", WITH_COUNTEREXAMPLE,
                         ids=[n for n, _ in WITH_COUNTEREXAMPLE])
def test_refusal_is_needed(backend, raw_compiler, name, case):
    """Unchecked, xgrammar accepts a text that fails validation (should xgrammar fix this,
    the test fails and the refusal can go)."""
    text = case["counterexample"]
    assert schema_errors(case["schema"], json.loads(text)), text
    assert _raw_accepts(backend, raw_compiler, case["schema"], text), text


# ---- enforced ----

@pytest.mark.parametrize("name,schema", ADVERSARIAL, ids=[n for n, _ in ADVERSARIAL])
def test_adversarial_random_walks_validate(backend, tokenizer, name, schema):
    compiled = backend.compile("json_schema", json.dumps(schema))
    for seed in range(2, 10):
        walk = random_walk(backend, backend.new_state(compiled), seed,
                           tokenizer=tokenizer if seed % 2 else None)
        assert walk.terminated, f"seed {seed}: no end after {len(walk.output_ids)} tokens"
        text = walk.text(backend)
        assert schema_errors(schema, json.loads(text)) == [], text


# (corpus schema, a text xgrammar accepts for the schema as written, that fails validation)
REWRITTEN = [
    ("63_one_of_enum_overlap", '{"color": "green"}'),
    ("64_one_of_equal_numbers", "1"),
    ("72_property_names_format", '{"2023-02-29": 1}'),
    ("78_formats_rewritten", '{"day": "2023-04-31", "at": "23:59:60Z", "stamp": '
                             '"0000-01-01T00:00:00Z", "v4": "10.0.0.01", "v6": "::1.2.3.04"}'),
    ("85_enum_typed", '{"s": null, "i": 2.5, "c": "x"}'),
    ("87_untyped_string_number_keywords", '{"code": "abc", "n": 9, "when": "x"}'),
    ("88_pattern_optional_groups", '"v1abc"'),
]


@pytest.mark.parametrize("name,text", REWRITTEN, ids=[n for n, _ in REWRITTEN])
def test_rewrite_closes_a_hole(backend, raw_compiler, name, text):
    schema = CORPUS[name]
    assert schema_errors(schema, json.loads(text)), text
    assert _raw_accepts(backend, raw_compiler, schema, text), text
    assert not _accepts(backend, backend.compile("json_schema", json.dumps(schema)), text)


def test_rewrites():
    schema = {"type": "object", "properties": {
        "e": {"type": "integer", "enum": [1, 1.5, "1", True, 2.0], "title": "E"},
        "c": {"const": "x", "enum": ["x", "y"]},
        "o": {"oneOf": [{"enum": ["a", "b"]}, {"const": "b"}, {"enum": [1, 1.0, None]}]},
        "f": {"type": ["string", "null"], "format": "ipv4"},
        "p": {"pattern": "^a(b+)?$"},
        "n": {"minimum": 1, "multipleOf": 2},
        "s": {"type": "string", "format": "email"}}}
    before = json.dumps(schema)
    props = rewrite_schema(schema)["properties"]
    assert json.dumps(schema) == before  # the argument is left as it was
    assert props["e"] == {"enum": [1, 2.0], "title": "E"}
    assert props["c"] == {"const": "x"}
    assert props["o"] == {"enum": ["a", 1, None]}  # 1 and 1.0 share a branch: listed once
    assert props["f"] == {"type": ["string", "null"], "pattern": FORMAT_PATTERNS["ipv4"]}
    assert props["p"] == {"pattern": "^a(b+){0,1}$", "type": "string"}
    assert props["n"] == {"minimum": 1, "multipleOf": 2, "type": "integer"}
    assert props["s"] == {"type": "string", "format": "email"}


def test_the_rewrite_reaches_structural_tag_schemas():
    inner = {"type": "string", "enum": ["a", 1]}
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
                                                "content": {"type": "json_schema",
                                                            "json_schema": inner}}}
    out = json.loads(prepare("structural_tag", json.dumps(tag)).spec)
    assert out["format"]["content"]["json_schema"] == {"const": "a"}
    legacy = {"structures": [{"begin": "<a>", "schema": inner, "end": "</a>"}],
              "triggers": ["<a>"]}
    out = json.loads(prepare("structural_tag", json.dumps(legacy)).spec)
    assert out["format"]["tags"][0]["content"]["json_schema"] == {"const": "a"}
    assert prepare("regex", "a(b)?").spec == "a(b)?"


@pytest.mark.parametrize("pattern,fixed", [
    ("^a(b)?$", "^a(b){0,1}$"), ("(?:x)??", "(?:x){0,1}?"), ("[)?]", "[)?]"),
    (r"\)?", r"\)?"), ("[^)]?", "[^)]?"), ("[]?)]", "[]?)]"), ("(a[)])?", "(a[)]){0,1}")])
def test_fix_pattern(pattern, fixed):
    assert fix_pattern(pattern) == fixed


# Optional groups ending in a repeat, which xgrammar 0.2.9 compiles wrongly in JSON strings.
BROKEN_PATTERNS = ["^a(bc+)?$", "^(ab*)?$", "^(?:[ab][bc]+)?$", "^c(?:c{1,2}[^a]*c+)?b$",
                   "^((cc{1,2}[bc]+)?)?$", "^a(b[a-c]+)?(c)?$"]


def test_optional_groups_match_as_re_does(backend, raw_compiler):
    texts = ["".join(t) for n in range(5) for t in itertools.product("abc", repeat=n)]
    raw_wrong = 0
    for pattern in BROKEN_PATTERNS:
        schema = {"type": "string", "pattern": pattern}
        compiled = backend.compile("json_schema", json.dumps(schema))
        for text in texts:
            expected = re.fullmatch(pattern, text) is not None
            assert _accepts(backend, compiled, json.dumps(text)) == expected, (pattern, text)
        raw_wrong += any(_raw_accepts(backend, raw_compiler, schema, json.dumps(text))
                         != (re.fullmatch(pattern, text) is not None) for text in texts)
    assert raw_wrong == len(BROKEN_PATTERNS)


# ---- the format patterns ----

def _ipv6_candidates(rng: random.Random) -> list[str]:
    octets = ["0", "1", "01", "255", "256", "99"]
    out = ["::", "::1", "1::", ":::", "1:::2", "::ffff:1.2.3.4", "1::2::3"]
    for _ in range(1500):
        groups = ["".join(rng.choice("0aF9") for _ in range(rng.choice([1, 2, 4, 4, 5])))
                  for _ in range(rng.randint(0, 9))]
        tail = ".".join(rng.choice(octets) for _ in range(4)) if rng.random() < 0.3 else None
        if rng.random() < 0.7 and groups:
            cut = rng.randint(0, len(groups))
            text = ":".join(groups[:cut]) + "::" + ":".join(groups[cut:])
        else:
            text = ":".join(groups)
        if tail is not None:
            text += ("" if text.endswith(":") or not text else ":") + tail
        out.append(text)
    return out


def _format_candidates() -> dict[str, list[str]]:
    rng = random.Random(0)
    years = ["0000", "0001", "0004", "0100", "0400", "1900", "2000", "2023", "2024", "9999"]
    dates = [f"{y}-{m:02d}-{d:02d}" for y in years for m in range(14) for d in range(33)]
    times = [f"{h}:{m}:{s}{frac}{zone}" for h in ("00", "09", "23", "24")
             for m in ("00", "59", "60") for s in ("00", "59", "60") for frac in ("", ".5")
             for zone in ("Z", "+00:00", "-23:59", "+24:00", "")]
    octets = ["0", "00", "01", "1", "9", "10", "99", "100", "199", "249", "250", "255", "256"]
    pointer_texts = ["".join(t) for n in range(6) for t in itertools.product("/~01a", repeat=n)]
    relative = ["".join(t) for n in range(5) for t in itertools.product("01/#~a", repeat=n)]
    return {
        "date": dates,
        "time": times,
        "date-time": [f"{d}T{t}" for d in rng.sample(dates, 60) for t in rng.sample(times, 20)],
        "ipv4": [".".join(rng.choice(octets) for _ in range(n)) for n in (3, 4, 4, 4, 5)
                 for _ in range(300)],
        "ipv6": _ipv6_candidates(rng),
        "json-pointer": pointer_texts,
        "relative-json-pointer": relative,
    }


CANDIDATES = _format_candidates()


@pytest.mark.parametrize("fmt", sorted(FORMAT_PATTERNS))
def test_format_pattern_is_the_checker_exactly(backend, fmt):
    """The pattern admits exactly what jsonschema's format checker admits (among candidates
    that hit every boundary), and xgrammar matches the rewritten format as `re` does."""
    pattern = re.compile(FORMAT_PATTERNS[fmt])
    compiled = backend.compile("json_schema", json.dumps({"type": "string", "format": fmt}))
    valid = 0
    for text in CANDIDATES[fmt]:
        ok = pattern.fullmatch(text) is not None
        assert ok == FORMAT_CHECKER.conforms(text, fmt), (fmt, text)
        assert _accepts(backend, compiled, json.dumps(text)) == ok, (fmt, text)
        valid += ok
    assert 0 < valid < len(CANDIDATES[fmt])


def test_ipv6_pattern_takes_every_compression():
    pattern = re.compile(FORMAT_PATTERNS["ipv6"])
    rng = random.Random(1)
    for _ in range(300):
        address = ipaddress.IPv6Address(rng.getrandbits(128) & ~(0xFFFF << 16 * rng.randint(0, 7)))
        for text in (address.compressed, address.exploded, str(address).upper()):
            assert pattern.fullmatch(text), text
        if rng.random() < 0.5:
            v4 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
            text = address.exploded.rsplit(":", 2)[0] + ":" + str(v4)
            assert pattern.fullmatch(text), text
