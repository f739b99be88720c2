"""Validation of a constraint (kind, spec) before compilation, with limits against grammar
bombs. Pure Python + interegular, so the HTTP process can reject a bad request with a 400
before it reaches the scheduler."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..errors import GrammarError
from .regex_check import RegexLimits, check_regex
from .schema_check import SchemaLimits, parse_json_schema

KINDS = ("regex", "json_schema", "json_object", "ebnf", "choices", "structural_tag")


@dataclass(frozen=True)
class GrammarLimits:
    regex: RegexLimits = field(default_factory=RegexLimits)
    schema: SchemaLimits = field(default_factory=SchemaLimits)
    max_ebnf_length: int = 64 * 1024
    max_ebnf_rules: int = 1000  # rules defined (`name ::= ...`) in an EBNF grammar
    max_choices: int = 1024
    max_choices_chars: int = 64 * 1024  # all choices together


def validate_constraint(kind: str, spec: str, limits: GrammarLimits | None = None) -> None:
    """Raise GrammarError (a 400) if the constraint is invalid, unsupported or too big.

    kind is one of KINDS; spec is the regex, the schema as a JSON string, the EBNF grammar, the
    choices as a JSON list of strings, or an xgrammar / SGLang structural tag as a JSON string
    (spec is ignored for "json_object").
    """
    limits = limits or GrammarLimits()
    if kind == "regex":
        check_regex(spec, limits.regex)
    elif kind == "json_schema":
        parse_json_schema(spec, limits.schema, limits.regex)
    elif kind == "json_object":
        return
    elif kind == "ebnf":
        check_ebnf(spec, limits.max_ebnf_length, limits.max_ebnf_rules)
    elif kind == "choices":
        parse_choices(spec, limits)
    elif kind == "structural_tag":
        parse_structural_tag(spec, limits)
    else:
        raise GrammarError(f"unknown constraint kind {kind!r}; expected one of {', '.join(KINDS)}")


# Verdicts of check_once: (kind, sha256 of spec, limits) -> a Future of None or the error.
VERDICT_CACHE_ENTRIES = 4096
_verdicts: OrderedDict[tuple, Future] = OrderedDict()
_verdicts_lock = threading.Lock()
# Specs longer than this are checked uncached (the length limits refuse them at once).
_MAX_CACHED_SPEC = 1024 * 1024


def check_once(kind: str, spec: str, limits: GrammarLimits | None = None) -> None:
    """validate_constraint, run once per distinct constraint in this process: verdicts (a
    pass, or the GrammarError) are kept in a thread-safe LRU keyed by (kind, sha256 of
    spec, limits), so a repeat costs a hash and a dict lookup, and concurrent checks of one
    constraint share one run. Thread-safe; call it off the event loop, e.g.
    `await asyncio.to_thread(check_once, kind, spec)` (a first check may take a few ms up to
    a few tens of ms for a large schema). Raises a fresh GrammarError each time."""
    limits = limits or GrammarLimits()
    if not isinstance(spec, str) or len(spec) > _MAX_CACHED_SPEC:
        validate_constraint(kind, spec, limits)
        return
    digest = hashlib.sha256(spec.encode("utf-8", "surrogatepass")).digest()
    key = (kind, digest, limits)
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        owner = verdict is None
        if owner:
            verdict = _verdicts[key] = Future()
            while len(_verdicts) > VERDICT_CACHE_ENTRIES:
                _verdicts.popitem(last=False)
        else:
            _verdicts.move_to_end(key)
    if not owner:
        error = verdict.result()
    else:
        try:
            validate_constraint(kind, spec, limits)
            error = None
        except GrammarError as exc:
            error = exc
        except BaseException as exc:  # a bug, not a verdict: not cached
            with _verdicts_lock:
                if _verdicts.get(key) is verdict:
                    del _verdicts[key]
            verdict.set_exception(exc)
            raise
        verdict.set_result(error)
    if error is not None:
        raise type(error)(error.message, param=error.param) from None


def clear_verdicts() -> None:
    """Forget check_once's verdicts (tests)."""
    with _verdicts_lock:
        _verdicts.clear()


_EBNF_RULE = re.compile(r"^[ \t]*[A-Za-z_][A-Za-z0-9_.-]*[ \t]*::=", re.MULTILINE)


def check_ebnf(spec: str, max_length: int, max_rules: int = 1000) -> None:
    """Cheap checks (xgrammar parses the grammar when it compiles, and names any error)."""
    if not isinstance(spec, str) or not spec.strip():
        raise GrammarError("ebnf must be a non-empty grammar string", param="ebnf")
    if len(spec) > max_length:
        raise GrammarError(f"ebnf is {len(spec)} characters long; the limit is {max_length}",
                           param="ebnf")
    if "::=" not in spec:
        raise GrammarError("ebnf defines no rule (expected `root ::= ...`)", param="ebnf")
    rules = len(_EBNF_RULE.findall(spec))
    if rules > max_rules:
        raise GrammarError(f"ebnf defines {rules} rules; the limit is {max_rules} "
                           "(max_ebnf_rules)", param="ebnf")


def parse_choices(spec: str, limits: GrammarLimits) -> list[str]:
    """The choices of a `choices` spec (a JSON list of non-empty strings)."""
    try:
        choices = json.loads(spec) if isinstance(spec, str) else None
    except ValueError:
        choices = None
    if (not isinstance(choices, list) or not choices
            or not all(isinstance(c, str) and c for c in choices)):
        raise GrammarError("choices must be a non-empty list of non-empty strings",
                           param="choices")
    if len(choices) > limits.max_choices:
        raise GrammarError(f"{len(choices)} choices given; the limit is {limits.max_choices}",
                           param="choices")
    total = sum(len(c) for c in choices)
    if total > limits.max_choices_chars:
        raise GrammarError(f"the choices hold {total} characters; the limit is "
                           f"{limits.max_choices_chars}", param="choices")
    return choices


def parse_structural_tag(spec: str, limits: GrammarLimits) -> dict:
    """A structural tag in xgrammar's format ({"type": "structural_tag", "format": ...}) or
    SGLang's legacy one ({"structures": [{"begin", "schema", "end"}], "triggers": [...]}),
    returned in xgrammar's format. Its JSON Schemas get the json_schema checks; the rest of
    the structure is checked by xgrammar when it compiles."""
    if not isinstance(spec, str) or len(spec) > limits.schema.max_bytes:
        raise GrammarError(f"structural_tag must be a JSON string of at most "
                           f"{limits.schema.max_bytes} characters", param="structural_tag")
    try:
        tag = json.loads(spec)
    except (ValueError, RecursionError) as exc:
        raise GrammarError(f"structural_tag is not valid JSON: {exc}",
                           param="structural_tag") from None
    if not isinstance(tag, dict):
        raise GrammarError("structural_tag must be a JSON object", param="structural_tag")
    if "structures" in tag:
        tag = _from_legacy_structural_tag(tag)
    if tag.get("type") != "structural_tag" or not isinstance(tag.get("format"), dict):
        raise GrammarError('structural_tag needs "type": "structural_tag" and a "format" object',
                           param="structural_tag")
    for schema in _tag_schemas(tag["format"], depth=0, max_depth=limits.schema.max_depth):
        parse_json_schema(json.dumps(schema), limits.schema, limits.regex)
    return tag


def _from_legacy_structural_tag(tag: dict) -> dict:
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if (not isinstance(structures, list) or not isinstance(triggers, list)
            or not all(isinstance(s, dict) and {"begin", "schema", "end"} <= s.keys()
                       for s in structures)):
        raise GrammarError('structural_tag "structures" must be a list of {"begin", "schema", '
                           '"end"} objects, with a "triggers" list', param="structural_tag")
    tags = [{"type": "tag", "begin": s["begin"], "end": s["end"],
             "content": {"type": "json_schema", "json_schema": s["schema"]}} for s in structures]
    return {"type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}


def _tag_schemas(node: object, depth: int, max_depth: int) -> list:
    """The JSON Schemas of every {"type": "json_schema"} format inside a structural tag."""
    if depth > max_depth:
        raise GrammarError(f"structural_tag nests deeper than {max_depth} levels",
                           param="structural_tag")
    found = []
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and isinstance(node.get("json_schema"), dict):
            found.append(node["json_schema"])
        children = [v for k, v in node.items() if k != "json_schema"]
    elif isinstance(node, list):
        children = node
    else:
        return found
    for child in children:
        found.extend(_tag_schemas(child, depth + 1, max_depth))
    return found
